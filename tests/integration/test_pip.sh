#!/usr/bin/env bash
# test_pip.sh - the Python package installed the way users do it, offline:
#   python3 -m venv --system-site-packages V
#   V/bin/pip install --no-build-isolation ./bindings/python
# (1) Against an installed libemlio found by pkg-config; (2) with no
# installed library, the package carries the one built in this tree;
# (3) venvs without system packages (no setuptools' `wheel`), from
# Debian's interpreter and from another CPython where there is one; an
# sdist that builds a wheel outside the repository. Each venv imports emlio and fetches an epoch from
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
# The examples put the source tree after site-packages (issue 34: they put
# it first, shadowing the installed package).
(env -u PYTHONPATH -u B -u EMLIO_LIBRARY ${PRELOAD[@]+"${PRELOAD[@]}"} \
    "$T/v2/bin/python" -c '
import runpy, sys
sys.argv = ["train_torch.py", "--help"]
try:
    runpy.run_path("examples/train_torch.py", run_name="__main__")
except SystemExit:
    pass
print(sys.modules["emlio"].__file__)' 2>"$T/example.err" | tail -1) >"$T/example.file"
check "an example run from the tree imports the installed emlio" \
    grep -q "^$site/emlio/__init__.py" "$T/example.file" ||
    tail -5 "$T/example.file" "$T/example.err"
abi=${VERSION%%.*}
[ "$abi" = 0 ] && abi=$(echo "$VERSION" | cut -d. -f1,2)
check "the package carries libemlio.so.$abi" test -f "$site/emlio/libemlio.so.$abi"
use_venv v2 "$site/emlio/"
check "venv 2: import, __version__ == $VERSION, one epoch, carried lib" \
    test $? -eq 0 || cat "$T/v2.out"

# (3) A venv that sees no system packages: no `wheel`, perhaps no
# setuptools, as a pyenv, conda or python.org interpreter has it (issue 34:
# `invalid command 'bdist_wheel'`). The build backend needs neither, with
# or without build isolation (it requires nothing, so pip fetches
# nothing). Debian's interpreter, then any other CPython on PATH.
bare_install() {
    local name=$1 py=$2
    shift 2
    "$py" -m venv "$T/$name" >"$T/$name.log" 2>&1 &&
        ! "$T/$name/bin/python" -c 'import wheel' 2>/dev/null &&
        env PKG_CONFIG_LIBDIR="$T/no-pc" PKG_CONFIG_PATH= \
            "$T/$name/bin/pip" install --no-index "$@" ./bindings/python \
            >>"$T/$name.log" 2>&1
}
bare_install v3 $PY --no-build-isolation
check "a venv without system packages (no wheel): pip install --no-build-isolation" \
    test $? -eq 0 || tail -5 "$T/v3.log"
use_venv v3 "$(echo "$T"/v3/lib/python3*/site-packages)/emlio/"
check "venv 3: import, one epoch, without numpy or torch" test $? -eq 0 ||
    cat "$T/v3.out"
other=""
for py in $(type -ap python3 python3.9 python3.10 python3.11 python3.12 python3.13 2>/dev/null) \
    "$HOME"/.pyenv/versions/*/bin/python3; do
    [ -x "$py" ] || continue
    real=$(readlink -f "$(command -v "$py")")
    case "$real" in /usr/bin/*) continue ;; esac
    "$py" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 9))' \
        2>/dev/null || continue
    other=$py
    break
done
if [ -n "$other" ]; then
    bare_install v4 "$other"
    check "another CPython ($("$other" --version 2>&1)): pip install, isolated build" \
        test $? -eq 0 || tail -5 "$T/v4.log"
    use_venv v4 "$(echo "$T"/v4/lib/python3*/site-packages)/emlio/"
    check "venv 4: import, one epoch" test $? -eq 0 || cat "$T/v4.out"
else
    skip "no CPython >= 3.9 other than Debian's on PATH or in ~/.pyenv: the other-interpreter install"
fi
# An sdist builds a wheel outside the repository (VERSION travels in it).
(cd bindings/python && /usr/bin/python3 -c '
import sys; sys.path.insert(0, "backend")
import emlio_backend as b
print(b.build_sdist(sys.argv[1]))' "$T") >"$T/sdist.name" 2>"$T/sdist.err"
check "the backend writes an sdist" test -s "$T/sdist.name"
mkdir -p "$T/unpacked" && tar -xzf "$T/$(cat "$T/sdist.name")" -C "$T/unpacked"
sd=$(echo "$T"/unpacked/emlio-*)
case $B in /*) abs_b=$B ;; *) abs_b=$PWD_REPO/$B ;; esac
(cd "$sd" && env PKG_CONFIG_LIBDIR="$T/no-pc" PKG_CONFIG_PATH= B="$abs_b" \
    /usr/bin/python3 -c '
import sys; sys.path.insert(0, "backend")
import emlio_backend as b
print(b.build_wheel(sys.argv[1]))' "$T") >"$T/wheel.name" 2>"$T/wheel.err"
check "... from which a wheel of version $VERSION builds" \
    grep -q "^emlio-$VERSION-" "$T/wheel.name" || cat "$T/wheel.err"
check "pip install wrote nothing into the package sources" bash -c \
    "! ls bindings/python/emlio | grep -qE '_build_config|libemlio'"
finish
