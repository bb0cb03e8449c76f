#!/usr/bin/env bash
# test_install.sh - `make install` into a DESTDIR staging tree: the files,
# SONAME and links, libemlio.pc; a small C program and both programs built
# against the staged install with `pkg-config --cflags --libs libemlio`
# alone (no source-tree include path) and run; a static link with
# `pkg-config --static --libs` alone; the exporters stay out of
# libemlio.so; `make uninstall` removes everything. Then a real install
# into a prefix of one's own: a program built with pkg-config runs without
# LD_LIBRARY_PATH, and man finds the pages (MANPATH, or PATH alone).
# Run from the repo root with B=<build dir>.
set -u
. tests/integration/lib.sh

VERSION=$(cat VERSION)
# The SONAME's version (the Makefile's ABI): MAJOR, or 0.MINOR on 0.x.
MAJOR=${VERSION%%.*}
[ "$MAJOR" = 0 ] && MAJOR=$(echo "$VERSION" | cut -d. -f1,2)
STAGE=$T/stage
PREFIX=/opt/emlio-test
ROOT=$STAGE$PREFIX
SAN_FLAGS=()
if [ -n "${EMLIO_SANITIZED:-}" ]; then
    SAN_FLAGS=(-fsanitize=address,undefined)
fi

make --no-print-directory -s B="$B" DESTDIR="$STAGE" PREFIX="$PREFIX" \
    install >"$T/install.log" 2>&1
check "make install DESTDIR=... PREFIX=... succeeds" test $? -eq 0

for f in bin/emliod bin/emlio lib/libemlio.so.$VERSION lib/libemlio.a \
    include/emlio.h include/emlio/core.h include/emlio/version.h \
    include/emlio/client.h include/emlio/server.h \
    lib/pkgconfig/libemlio.pc share/man/man8/emliod.8 \
    share/man/man1/emlio.1 lib/systemd/system/emliod@.service; do
    check "installed $f" test -f "$ROOT/$f"
done
check "libemlio.so.$MAJOR -> libemlio.so.$VERSION" \
    test "$(readlink "$ROOT/lib/libemlio.so.$MAJOR")" = "libemlio.so.$VERSION"
check "libemlio.so -> libemlio.so.$MAJOR" \
    test "$(readlink "$ROOT/lib/libemlio.so")" = "libemlio.so.$MAJOR"
check "SONAME is libemlio.so.$MAJOR" bash -c \
    "readelf -d '$ROOT/lib/libemlio.so.$VERSION' | grep -q 'SONAME.*\[libemlio.so.$MAJOR\]'"
check "no private header installed" bash -c \
    "! ls '$ROOT/include/emlio' | grep -qE '^(buf|example|tfrecord|metrics|influx|emlio_internal)\.h$' ||
     ! test -e '$ROOT/include/emlio/emlio_internal.h' -o -e '$ROOT/include/emlio/metrics.h'"
check "the unit names the installed emliod" \
    grep -q "^ExecStart=$PREFIX/bin/emliod --config /etc/emlio/%i.conf" \
    "$ROOT/lib/systemd/system/emliod@.service"

# pkg-config sees the staged tree through the sysroot variable, as a
# packager's build would.
export PKG_CONFIG_PATH=$ROOT/lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$STAGE
check "pkg-config --modversion libemlio is VERSION" \
    test "$(pkg-config --modversion libemlio)" = "$VERSION"
CFLAGS_PC=$(pkg-config --cflags libemlio | xargs)
LIBS_PC=$(pkg-config --libs libemlio | xargs)
check "pkg-config --cflags is the staged include dir alone" \
    test "$CFLAGS_PC" = "-I$ROOT/include"

cat >"$T/prog.c" <<'C'
/* Uses the installed API: version, TFRecord and Example writers/parsers,
 * the byte buffer, the planner, a transform (libjpeg, libpng) and the
 * server's configuration (the I/O engine: liburing where built in), so a
 * static link needs every library libemlio.pc must list. */
#include <emlio.h>
#include <stdio.h>
#include <string.h>

int
main(void)
{
    if (strcmp(emlio_version_string(), EMLIO_VERSION_STRING) != 0 ||
        emlio_version() != EMLIO_VERSION)
        return 10;
    emlio_buf_t ex = EMLIO_BUF_INIT;
    emlio_buf_t rec = EMLIO_BUF_INIT;
    const uint8_t img[] = { 1, 2, 3, 4, 5 };
    if (emlio_example_build(&ex, "image/encoded", img, sizeof(img),
                            "image/class/label", 42) < 0 ||
        emlio_tfrecord_append(&rec, ex.data, ex.len) < 0)
        return 11;
    emlio_example_field_t f[2] = { { .key = "image/encoded", .key_len = 13 },
                                   { .key = "image/class/label",
                                     .key_len = 17 } };
    if (emlio_example_parse(ex.data, ex.len, f, 2) != 2 ||
        f[0].bytes_len != 5 || f[1].int64 != 42)
        return 12;
    const uint32_t holder = 0;
    emlio_plan_shard_t shard = { .name = "a", .records = 10,
                                 .holders = &holder, .n_holders = 1 };
    emlio_plan_params_t params;
    emlio_plan_params_init(&params);
    params.batch_size = 4;
    emlio_plan_t *plan = emlio_plan_new();
    if (!plan || emlio_plan_build(plan, &shard, 1, &params) < 0)
        return 13;
    emlio_transform_t *xf = NULL;
    char err[256];
    if (emlio_transform_parse("random_resized_crop(224)", &xf, err,
                              sizeof(err)) < 0)
        return 14;
    emlio_transform_destroy(&xf);
    emlio_server_config_t cfg;
    emlio_server_config_init(&cfg);
    if (!cfg.workers)
        return 15;
    printf("version %s record %zu bytes batches %zu\n",
           emlio_version_string(), rec.len, emlio_plan_batch_count(plan));
    emlio_plan_destroy(&plan);
    emlio_buf_release(&ex);
    emlio_buf_release(&rec);
    return 0;
}
C
# shellcheck disable=SC2086
cc -std=c11 -Wall -Wextra -Werror "${SAN_FLAGS[@]}" $CFLAGS_PC \
    -o "$T/prog" "$T/prog.c" $LIBS_PC 2>"$T/prog.err"
check "a C program builds with pkg-config flags alone" test $? -eq 0
LD_LIBRARY_PATH=$ROOT/lib "$T/prog" >"$T/prog.out" 2>&1
check "it runs against the staged libemlio.so" \
    grep -q "^version $VERSION record [0-9]* bytes batches 3$" "$T/prog.out"
check "it needs libemlio.so.$MAJOR" bash -c \
    "readelf -d '$T/prog' | grep -q 'NEEDED.*\[libemlio.so.$MAJOR\]'"
# (pkg-config puts the sysroot before it, as before -L: a staged build is
# the packager's, who installs into /usr, where no RUNPATH is added.)
check "pkg-config --libs gives it RUNPATH .../$PREFIX/lib" bash -c \
    "readelf -d '$T/prog' | grep -qE '(RUNPATH|RPATH).*$PREFIX/lib\]'"

# A static link: libemlio.a, and libzmq.a and libmsgpackc.a when the
# system has them (libzmq is C++: its own libraries must be listed too),
# with nothing but what `pkg-config --static --libs` says.
STATIC_PC=$(pkg-config --static --libs libemlio | sed -E 's/(^| )-lemlio( |$)/ /')
STATIC_DEPS=()
for dep in zmq msgpackc; do
    if cc -print-file-name="lib$dep.a" | grep -q /; then
        STATIC_DEPS+=("-l$dep")
    fi
done
# Under `make check` libemlio.a holds ASan/UBSan calls: a static program
# then links the sanitizer runtimes itself (a shared one gets them through
# libemlio.so).
SAN_LINK=${EMLIO_SANITIZED:+-fsanitize=address,undefined}
# shellcheck disable=SC2086
cc -std=c11 -Wall -Werror $CFLAGS_PC -o "$T/prog-static" "$T/prog.c" \
    -Wl,-Bstatic -lemlio "${STATIC_DEPS[@]}" -Wl,-Bdynamic $STATIC_PC \
    $SAN_LINK 2>"$T/prog-static.err"
check "a static link with pkg-config --static --libs alone (static: libemlio ${STATIC_DEPS[*]})" \
    test $? -eq 0
check "the static program runs" \
    grep -q "^version $VERSION record" <("$T/prog-static" 2>&1)
check "the static program needs no libemlio.so" \
    bash -c "! readelf -d '$T/prog-static' | grep -q 'NEEDED.*libemlio'"

# Both programs from their sources against the staged install: their own
# directories and tools/common only, never include/ or src/.
build_tool() { # build_tool NAME EXTRA_LIBS... : writes $T/built/NAME
    local name=$1
    shift
    mkdir -p "$T/built"
    # shellcheck disable=SC2086
    cc -std=c11 -O1 "${SAN_FLAGS[@]}" $CFLAGS_PC -Itools/common \
        -o "$T/built/$name" tools/"$name"/*.c tools/common/*.c \
        $LIBS_PC "$@" -lpthread -lm 2>"$T/built-$name.err"
}
build_tool emliod
check "emliod builds against the installed library" test $? -eq 0
# shellcheck disable=SC2046
build_tool emlio $(PKG_CONFIG_SYSROOT_DIR= pkg-config --libs libturbojpeg 2>/dev/null || echo -lturbojpeg)
check "emlio builds against the installed library" test $? -eq 0
export LD_LIBRARY_PATH=$ROOT/lib
check "built emliod --version" \
    test "$("$T/built/emliod" --version)" = "emliod $VERSION (libemlio $VERSION)"
check "built emlio --version" \
    test "$("$T/built/emlio" --version)" = "emlio $VERSION (libemlio $VERSION)"
check "built emlio loads the staged library" bash -c \
    "ldd '$T/built/emlio' | grep -q '$ROOT/lib/libemlio.so.$MAJOR'"

EMLIO=$T/built/emlio EMLIOD=$T/built/emliod
make_dataset "$T/ds" 120 4 3000 64K
check "built emlio synth + pack make a dataset" test $? -eq 0
if start_daemon d1 "$T/ds/shards"; then
    ok "built emliod serves it"
    "$EMLIO" fetch --connect "$EP" --batch 16 --epochs 2 --verify --quiet \
        >"$T/fetch.out" 2>"$T/fetch.err"
    check "built emlio fetch --verify: two epochs exactly once" \
        test "$(json_field "$T/fetch.out" verified)" = True
    kill "$DPID"
else
    fail "built emliod serves it"
fi
unset LD_LIBRARY_PATH

# The installed programs find their library through RUNPATH $ORIGIN/../lib.
check "installed emlio runs without LD_LIBRARY_PATH" \
    test "$("$ROOT/bin/emlio" --version)" = "emlio $VERSION (libemlio $VERSION)"
check "installed emliod runs without LD_LIBRARY_PATH" \
    test "$("$ROOT/bin/emliod" --version)" = "emliod $VERSION (libemlio $VERSION)"

# Daemon-only modules: in the programs, not in what training processes load.
nm -D --defined-only "$ROOT/lib/libemlio.so.$VERSION" >"$T/dynsym" 2>&1
check "libemlio.so exports no exporter (metrics/influx) symbol" \
    bash -c "! grep -qiE 'metrics|influx' '$T/dynsym'"
check "libemlio.so exports no internal emlio__ symbol" \
    bash -c "! grep -q ' emlio__' '$T/dynsym'"
check "emliod carries the metrics exporter itself" bash -c \
    "nm '$ROOT/bin/emliod' | grep -q ' tool_metrics_new$'"
# Every function a public header marks EMLIO_EXPORT is exported.
grep -hv '^#' include/emlio/*.h | tr '\n' ' ' | grep -o 'EMLIO_EXPORT[^(;]*(' |
    sed -E 's/.*[ *]([a-z_0-9]+) *\($/\1/' | sort -u >"$T/declared"
missing=$(while read -r fn; do
    grep -q " T $fn$" "$T/dynsym" || echo "$fn"
done <"$T/declared")
check "all $(wc -l <"$T/declared") EMLIO_EXPORT functions are exported${missing:+ (missing: $missing)}" \
    test -z "$missing"

make --no-print-directory -s B="$B" DESTDIR="$STAGE" PREFIX="$PREFIX" \
    uninstall >"$T/uninstall.log" 2>&1
check "make uninstall succeeds" test $? -eq 0
left=$(find "$STAGE" \( -type f -o -type l \) | sed "s|^$STAGE||")
check "make uninstall leaves no file behind${left:+: $left}" test -z "$left"

# A prefix of one's own, installed for real (no DESTDIR), as a user would:
# `make install PREFIX=~/opt/emlio`, then build with pkg-config and run.
OWN=$T/own/emlio
unset PKG_CONFIG_SYSROOT_DIR LD_LIBRARY_PATH
make --no-print-directory -s B="$B" PREFIX="$OWN" install \
    >"$T/install-own.log" 2>&1
check "make install PREFIX=\$OWN succeeds" test $? -eq 0
export PKG_CONFIG_PATH=$OWN/lib/pkgconfig
check "its libdir is \$OWN/lib" \
    test "$(pkg-config --variable=libdir libemlio)" = "$OWN/lib"
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror "${SAN_FLAGS[@]}" -o "$T/prog-own" "$T/prog.c" \
    $(pkg-config --cflags --libs libemlio) 2>"$T/prog-own.err"
check "a program builds against the own prefix with pkg-config" test $? -eq 0
check "it runs without LD_LIBRARY_PATH" \
    grep -q "^version $VERSION record" <("$T/prog-own" 2>&1)
check "it loads the own prefix's library" bash -c \
    "ldd '$T/prog-own' | grep -q '$OWN/lib/libemlio.so.$MAJOR'"
if command -v man >/dev/null; then
    check "man finds emliod(8) with MANPATH=\$OWN/share/man:" test \
        "$(MANPATH=$OWN/share/man: man -w emliod)" = "$OWN/share/man/man8/emliod.8"
    check "man finds emlio(1) from PATH alone" test \
        "$(env -u MANPATH PATH="$OWN/bin:$PATH" man -w emlio)" = "$OWN/share/man/man1/emlio.1"
else
    skip "man is not installed: cannot check the man pages are found"
fi
make --no-print-directory -s B="$B" PREFIX="$OWN" uninstall \
    >"$T/uninstall-own.log" 2>&1
left=$(find "$OWN" \( -type f -o -type l \) 2>/dev/null)
check "make uninstall PREFIX=\$OWN leaves no file behind${left:+: $left}" \
    test -z "$left"
unset PKG_CONFIG_PATH
finish
