#!/usr/bin/env bash
# test_pip.sh - the Python package installed the way users do it, offline:
#   python3 -m venv --system-site-packages V
#   V/bin/pip install --no-build-isolation ./bindings/python
# (Debian's pip and setuptools). (1) Against an installed libemlio found by
# pkg-config; (2) with no installed library, the package carries the one
# built in this tree. Each venv imports emlio and fetches an epoch from
# outside the source tree with no EMLIO_LIBRARY, B or PYTHONPATH, and
# emlio.__version__ equals the library's version.
# Run from the repo root with B=<build dir>.
set -u
. tests/integration/lib.sh

PY=/usr/bin/python3
VERSION=$(cat VERSION)
if ! $PY -c 'import venv, ensurepip' 2>/dev/null; then
    skip "python3-venv is not installed: pip install checks"
    finish
    exit $?
fi
# Under `make check` the library is sanitized: the interpreter needs the
# ASan/UBSan runtimes first.
PRELOAD=()
if [ -n "${EMLIO_PY_PRELOAD:-}" ]; then
    PRELOAD=(LD_PRELOAD="$EMLIO_PY_PRELOAD"
        ASAN_OPTIONS="detect_leaks=0:halt_on_error=1")
fi

make_dataset "$T/ds" 96 3 2000 32K || fail "dataset"
start_daemon d1 "$T/ds/shards" || fail "daemon"

cat >"$T/use.py" <<'PYEOF'
import os
import sys

import emlio

want_version, endpoint, want_prefix = sys.argv[1:4]
assert "emlio" not in os.environ.get("PYTHONPATH", ""), "PYTHONPATH is set"
assert not emlio.__file__.startswith(os.environ["REPO"]), emlio.__file__
print("version", emlio.__version__)
print("library", emlio.library_path)
n = 0
with emlio.Loader(endpoint, batch_size=16, epochs=1) as loader:
    for batch in loader:
        n += len(batch)
print("samples", n)
ok = (emlio.__version__ == want_version and
      emlio.library_path.startswith(want_prefix) and n == 96)
sys.exit(0 if ok else 1)
PYEOF

# venv_install NAME [ENV...]: a fresh venv with the package pip-installed.
venv_install() {
    local name=$1
    shift
    $PY -m venv --system-site-packages "$T/$name" >"$T/$name.log" 2>&1 &&
        env "$@" "$T/$name/bin/pip" install --no-build-isolation --no-index \
            ./bindings/python >>"$T/$name.log" 2>&1
}

# use_venv NAME PREFIX: runs use.py from / with a clean environment.
use_venv() {
    (cd / && env -u B -u EMLIO_LIBRARY -u PYTHONPATH -u PKG_CONFIG_PATH \
        REPO="$PWD_REPO" "${PRELOAD[@]}" "$T/$1/bin/python" "$T/use.py" \
        "$VERSION" "$EP" "$2") >"$T/$1.out" 2>&1
}
PWD_REPO=$PWD

# (1) An installed library (a real PREFIX, as `make install` does it).
make --no-print-directory -s B="$B" PREFIX="$T/prefix" install \
    >"$T/install.log" 2>&1
check "make install PREFIX=\$T/prefix" test $? -eq 0
venv_install v1 PKG_CONFIG_PATH="$T/prefix/lib/pkgconfig"
check "pip install --no-build-isolation (installed libemlio)" test $? -eq 0 ||
    tail -5 "$T/v1.log"
check "pip records the installed library" grep -q \
    "^LIBRARY = '$T/prefix/lib/libemlio.so" \
    "$T"/v1/lib/python3*/site-packages/emlio/_build_config.py
"$T/v1/bin/pip" show emlio >"$T/v1.show" 2>&1
check "package metadata version is VERSION" grep -qx "Version: $VERSION" \
    "$T/v1.show"
use_venv v1 "$T/prefix/lib/"
check "venv 1: import, __version__ == $VERSION, one epoch, installed lib" \
    test $? -eq 0 || cat "$T/v1.out"
(cd / && env -u B -u PYTHONPATH EMLIO_LIBRARY=/nonexistent/libemlio.so \
    "$T/v1/bin/python" -c 'import emlio' >/dev/null 2>&1)
check "EMLIO_LIBRARY still overrides (a wrong path fails the import)" \
    test $? -ne 0

# (2) Nothing installed: pkg-config finds no libemlio, the wheel carries
# the library of this tree.
venv_install v2 PKG_CONFIG_LIBDIR="$T/no-pc" PKG_CONFIG_PATH=
check "pip install --no-build-isolation (no installed libemlio)" test $? -eq 0 ||
    tail -5 "$T/v2.log"
site=$(echo "$T"/v2/lib/python3*/site-packages)
check "the package carries libemlio.so.${VERSION%%.*}" \
    test -f "$site/emlio/libemlio.so.${VERSION%%.*}"
use_venv v2 "$site/emlio/"
check "venv 2: import, __version__ == $VERSION, one epoch, carried lib" \
    test $? -eq 0 || cat "$T/v2.out"
check "pip install wrote nothing into the package sources" bash -c \
    "! ls bindings/python/emlio | grep -qE '_build_config|libemlio'"
finish
