#!/usr/bin/env bash
# tests/run.sh - runs every test program, each in its own process with a
# timeout, and ends with the single line "N passed, N failed".
# Unit tests speak TAP (cmocka), so each test case counts; integration,
# fuzz-replay and Python test scripts count one per script, or per test case
# when they print their own "N passed, N failed" line.
set -u
B=${B:-build}
TIMEOUT=${TEST_TIMEOUT:-300}
passed=0
failed=0
skipped=0
failures=()
log_dir=$B/test-logs
mkdir -p "$log_dir"

# run NAME CMD...: runs one program, counts its results from its output.
run() {
    local name=$1
    shift
    local log=$log_dir/$(echo "$name" | tr '/ ' '__').log
    local t0=$SECONDS
    timeout -k 10 "$TIMEOUT" "$@" >"$log" 2>&1
    local rc=$?
    local ok bad summary
    ok=$(grep -cE '^ok [0-9]+' "$log")
    bad=$(grep -cE '^not ok [0-9]+' "$log")
    summary=$(grep -E '^([A-Za-z]+: )?[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    if [ -n "$summary" ]; then
        ok=$(echo "$summary" | sed -E 's/^([A-Za-z]+: )?([0-9]+) passed.*/\2/')
        bad=$(echo "$summary" | sed -E 's/.* ([0-9]+) failed.*/\1/')
    fi
    if [ "$ok" -eq 0 ] && [ "$bad" -eq 0 ]; then
        if [ $rc -eq 0 ]; then ok=1; else bad=1; fi
    elif [ $rc -ne 0 ] && [ "$bad" -eq 0 ]; then
        bad=1 # crashed or timed out after its last report
    fi
    passed=$((passed + ok))
    failed=$((failed + bad))
    # Checks that cannot run here print "skip - WHY"; never counted passed.
    skipped=$((skipped + $(grep -c '^skip - ' "$log")))
    if [ "$bad" -ne 0 ]; then
        failures+=("$name")
        echo "FAIL $name (rc=$rc, $((SECONDS - t0))s) - log: $log"
        tail -n 30 "$log" | sed 's/^/    /'
    else
        echo "ok   $name ($ok, $((SECONDS - t0))s)"
    fi
}

export CMOCKA_MESSAGE_OUTPUT=TAP
for t in "$B"/tests/test_*; do
    [ -x "$t" ] && run "unit/$(basename "$t")" "$t"
done
for t in "$B"/fuzz/replay_*; do
    [ -x "$t" ] || continue
    target=$(basename "$t"); target=${target#replay_fuzz_}
    run "fuzz-replay/$target" "$t" fuzz/corpus/"$target" fuzz/regressions/"$target"
done
for t in tests/integration/test_*.sh; do
    [ -f "$t" ] && run "integration/$(basename "$t" .sh)" env B="$B" bash "$t"
done
# Under `make check` the library is sanitized: Python needs the runtimes
# preloaded, and must not report CPython's own end-of-run allocations.
py_env=(env B="$B")
if [ -n "${EMLIO_PY_PRELOAD:-}" ]; then
    py_env+=(LD_PRELOAD="$EMLIO_PY_PRELOAD"
        ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:quarantine_size_mb=32")
fi
for t in tests/python/test_*.py; do
    [ -f "$t" ] && run "python/$(basename "$t" .py)" "${py_env[@]}" /usr/bin/python3 "$t"
done

if [ ${#failures[@]} -ne 0 ]; then
    echo "failed: ${failures[*]}"
fi
if [ "$skipped" -ne 0 ]; then
    echo "$skipped checks skipped:"
    grep -h '^skip - ' "$log_dir"/*.log | sed 's/^skip - /    /'
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
