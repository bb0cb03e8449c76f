#!/usr/bin/env bash
# test_texts.sh - the manuals follow the option tables: every option that
# `emliod --help` and `emlio COMMAND --help` print (generated from the
# tables the parsers use) is described in emliod(8) or emlio(1).
# Run from the repo root with B=<build dir>.
set -u
. tests/integration/lib.sh

# options_of CMD...: the --long options a help text lists, one a line.
options_of() {
    "$@" --help 2>&1 | grep -oE '^ +(-[a-zA-Z], )?--[a-z0-9-]+' |
        grep -oE -- '--[a-z0-9-]+' | sort -u
}

# in_man PAGE OPTION: the option as troff writes it (\-\-name).
in_man() {
    grep -qF -- "$(printf '%s' "$2" | sed 's/-/\\-/g')" "$1"
}

n=0
missing=""
for o in $(options_of "$EMLIOD"); do
    n=$((n + 1))
    in_man man/emliod.8.in "$o" || missing="$missing emliod:$o"
done
check "emliod(8) describes all $n options of emliod --help${missing:+ (missing:$missing)}" \
    test -z "$missing"

# (keygen takes no option but NAME.)
for c in synth pack index inspect fetch plan energy; do
    n=0
    missing=""
    for o in $(options_of "$EMLIO" "$c"); do
        n=$((n + 1))
        in_man man/emlio.1.in "$o" || missing="$missing $o"
    done
    check "emlio(1) describes all $n options of emlio $c --help${missing:+ (missing:$missing)}" \
        test -z "$missing" -a "$n" -gt 0
done
check "emlio(1) documents EMLIO_LOG_LEVEL" grep -q EMLIO_LOG_LEVEL man/emlio.1.in
check "emliod --help names every format" bash -c \
    "'$EMLIOD' --help | grep -q 'WebDataset' && '$EMLIOD' --help | grep -q ImageFolder"
finish
