#!/usr/bin/env bash
# test_runner.sh - tests/run.sh counts skips apart from passes and failures:
# a fake tree with a TAP program (one case skipped), a script that skips a
# check, one that skips as a whole (exit 77), one that fails and one that
# passes must end with "4 passed, 1 failed, 3 skipped".
# SPDX-License-Identifier: MIT
. "$(dirname "$0")/lib.sh"
RUN=$(cd "$(dirname "$0")/.." && pwd)/run.sh
mkdir -p "$T/tree/tests/integration" "$T/tree/b/tests"
cat >"$T/tree/b/tests/test_fake" <<'X'
#!/bin/sh
echo "1..2"
echo "ok 1 - test_fake_works"
echo "ok 2 - test_fake_optional # SKIP no device"
X
chmod +x "$T/tree/b/tests/test_fake"
printf 'echo "ok - a"\necho "skip - b"\necho "1 passed, 0 failed, 1 skipped"\n' \
    >"$T/tree/tests/integration/test_a.sh"
printf 'echo "skip - no namespaces"\nexit 77\n' >"$T/tree/tests/integration/test_b.sh"
printf 'echo "1 passed, 1 failed"\nexit 1\n' >"$T/tree/tests/integration/test_c.sh"
printf 'exit 0\n' >"$T/tree/tests/integration/test_d.sh"
OUT=$(cd "$T/tree" && B=b bash "$RUN" 2>&1)
RC=$?
LAST=$(tail -n 1 <<<"$OUT")
check "run.sh counts skips apart ($LAST)" test "$LAST" = "4 passed, 1 failed, 3 skipped"
check "run.sh fails when a test failed" test "$RC" -ne 0
check "run.sh names the failing script" grep -q "FAIL integration/test_c" <<<"$OUT"
finish
