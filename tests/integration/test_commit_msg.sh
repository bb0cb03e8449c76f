#!/usr/bin/env bash
# test_commit_msg.sh - scripts/commit-msg, the hook `make` installs: a
# subject of at most 72 characters, a blank line, a body; merges, reverts
# and fixups pass; a comment line is not a body.
set -u
. tests/integration/lib.sh
hook=scripts/commit-msg
msg() { printf '%b' "$1" >"$T/msg"; "$hook" "$T/msg" 2>"$T/err"; }
msg "store: a subject\n\nWhy it changed.\n"
check "a subject, a blank line and a body pass" test $? -eq 0
msg "$(printf 'x%.0s' $(seq 73))\n\nbody\n"
check "a 73-character subject fails" test $? -ne 0
check "... saying how long it is" grep -q "has 73 characters" "$T/err"
msg "$(printf 'x%.0s' $(seq 72))\n\nbody\n"
check "a 72-character subject passes" test $? -eq 0
msg "store: no body\n"
check "a subject alone fails" test $? -ne 0
check "... saying a body is missing" grep -q "no body" "$T/err"
msg "store: a subject\n\n# Please enter the commit message\n"
check "a comment is not a body" test $? -ne 0
msg "store: a subject\nno blank line\n"
check "a body without the blank line fails" test $? -ne 0
msg "Merge branch 'x'\n"
check "a merge passes" test $? -eq 0
msg "fixup! store: a subject\n"
check "a fixup passes" test $? -eq 0
if h=$(git rev-parse --git-path hooks 2>/dev/null); then
    check "make installed the hook in this clone" cmp -s "$hook" "$h/commit-msg"
else
    skip "not a git clone: no hook to install"
fi
finish
