#!/usr/bin/env bash
# test_headers.sh - every public header compiles on its own (as C11 and as
# C++), includes no system header beyond <stddef.h> <stdint.h> <stdbool.h>,
# and every example in a header comment ("Example:" followed by indented
# code) compiles and links against libemlio.so.
# Run from the repo root with B=<build dir>.
set -u
. tests/integration/lib.sh

INC=(-Iinclude -I"$B/include")
headers=(include/emlio.h include/emlio/*.h "$B/include/emlio/version.h")
for h in "${headers[@]}"; do
    name=${h#include/}
    name=${name#"$B"/include/}
    printf '#include "%s"\n#include "%s"\ntypedef int nonempty_t;\n' \
        "$name" "$name" >"$T/alone.c"
    cc -std=c11 -Wall -Wextra -Wpedantic -Werror -Wstrict-prototypes \
        "${INC[@]}" -fsyntax-only "$T/alone.c" 2>"$T/alone.err"
    check "$name compiles alone (C11, twice: guarded)" test $? -eq 0 ||
        cat "$T/alone.err"
    if command -v c++ >/dev/null; then
        c++ -x c++ -std=c++11 -Wall -Werror "${INC[@]}" -fsyntax-only \
            "$T/alone.c" 2>"$T/alone.err"
        check "$name compiles alone (C++11)" test $? -eq 0
    fi
    others=$(grep -oE '#\s*include\s*<[^>]+>' "$h" |
        grep -vE '<(stddef|stdint|stdbool)\.h>' || true)
    check "$name includes only stddef/stdint/stdbool${others:+ (has $others)}" \
        test -z "$others"
done

# extract FILE: prints each example of FILE's comments as one line-block,
# blocks separated by a line "@@".
extract() {
    awk '
        / \* Example:$/ { inblock = 1; next }
        inblock && /^ \*   / { sub(/^ \*   /, ""); print; next }
        inblock { inblock = 0; print "@@" }
    ' "$1"
}

n_examples=0
for h in include/emlio/*.h; do
    extract "$h" >"$T/blocks"
    i=0
    code=""
    while IFS= read -r line; do
        if [ "$line" != "@@" ]; then
            code+="$line"$'\n'
            continue
        fi
        i=$((i + 1))
        n_examples=$((n_examples + 1))
        src=$T/example_$(basename "$h" .h)_$i.c
        cat >"$src" <<C
#include <stdio.h>
#include <stdlib.h>

#include "emlio.h"

#define UNUSED __attribute__((unused))
static UNUSED void die(const char *msg) { fprintf(stderr, "%s\\n", msg); exit(1); }
static UNUSED void train_on(const void *d, size_t n, int64_t l) { (void)d; (void)n; (void)l; }
static UNUSED void consume(const void *d, size_t n) { (void)d; (void)n; }
static UNUSED void do_the_work(void) {}
static UNUSED void wait_for_shutdown(void) {}
static UNUSED const uint8_t jpeg[4] = { 0xff, 0xd8, 0xff, 0xd9 };
static UNUSED const size_t jpeg_len = sizeof(jpeg);

void example(emlio_ctx_t *ctx);
void
example(emlio_ctx_t *ctx)
{
    (void)ctx;
$code}

int
main(void)
{
    return 0;
}
C
        cc -std=c11 -Wall -Wextra -Werror "${INC[@]}" -o "${src%.c}" "$src" \
            -L"$B/lib" -lemlio 2>"$T/example.err"
        check "example $i of $(basename "$h") compiles and links" test $? -eq 0 ||
            sed 's/^/    /' "$T/example.err" | head -20
        code=""
    done <"$T/blocks"
done
# client, server, energy, buf and example each show one.
check "at least 5 header examples found ($n_examples)" test "$n_examples" -ge 5

# The extractor itself: a broken example must fail to compile.
printf ' * Example:\n *   int x = undeclared_thing;\n */\n' >"$T/bad.h"
extract "$T/bad.h" | head -1 >"$T/bad.code"
printf '#include "emlio.h"\nvoid f(void);\nvoid f(void) {\n%s\n}\n' \
    "$(cat "$T/bad.code")" >"$T/bad.c"
check "a broken example is caught" bash -c \
    "! cc -std=c11 -Werror ${INC[*]} -c '$T/bad.c' -o '$T/bad.o' 2>/dev/null"
finish
