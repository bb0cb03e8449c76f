#!/usr/bin/env bash
# test_energy_cli.sh - `emlio energy -- CMD`: the JSON last line, CPU time of
# children, exit status and signal passthrough, stdin/stdout passthrough,
# and a synthetic RAPL tree (EMLIO_POWERCAP_ROOT) whose counter another
# process advances and wraps. Run from the repo root with B=<build dir>.
# Ends with "N passed, N failed" and exits non-zero on any failure.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/integration/lib.sh
PY=/usr/bin/python3

# jq_last FILE EXPR: evaluates a Python expression over the JSON object on
# the last line of FILE (bound to j); prints the result, fails on bad JSON.
jq_last() {
    "$PY" -c '
import json, sys
lines = open(sys.argv[1]).read().splitlines()
j = json.loads(lines[-1])
print(eval(sys.argv[2]))
' "$1" "$2"
}

# The tests must not depend on this machine's counters or GPU.
export EMLIO_POWERCAP_ROOT=$T/no-powercap

# 1. JSON last line, with the command's own stdout before it.
"$EMLIO" energy -- sh -c 'echo hello' >"$T/out1" 2>"$T/err1"
rc=$?
if [ $rc -eq 0 ] && [ "$(head -n 1 "$T/out1")" = hello ] &&
    [ "$(jq_last "$T/out1" 'sorted(k for k in ("seconds","cpu_s","energy_j","energy_source","exit_code","domains","meter_readings") if k in j) == sorted(["seconds","cpu_s","energy_j","energy_source","exit_code","domains","meter_readings"]) and "samples" not in j and j["meter_readings"] >= 2 and j["exit_code"] == 0 and j["seconds"] >= 0 and isinstance(j["domains"], list)')" = True ]; then
    ok "json last line has seconds, cpu_s, energy_j, energy_source, exit_code, domains, meter_readings (not 'samples')"
else
    fail "json last line (rc=$rc)"
    cat "$T/out1" "$T/err1"
fi
if grep -q 'Energy stats for' "$T/err1" && grep -q 'wall time' "$T/err1"; then
    ok "human summary on stderr"
else
    fail "human summary on stderr"
    cat "$T/err1"
fi

# 2. Without counters the figure is the model's and says so.
if [ "$(jq_last "$T/out1" 'j["energy_source"].startswith("model") and j["modelled"] and all(d["source"] in ("model", "nvml") for d in j["domains"])')" = True ]; then
    ok "no counters: energy_source model, labelled as modelled"
else
    fail "model labelling"
    tail -n 1 "$T/out1"
fi

# 3. CPU time of a CPU-burning child (and its own child).
"$EMLIO" energy --gpu off -- sh -c 'sh -c "i=0; while [ \$i -lt 150000 ]; do i=\$((i+1)); done"' \
    >"$T/out3" 2>/dev/null
v=$(jq_last "$T/out3" 'j["cpu_s"] > 0.02 and j["cpu_s"] <= j["seconds"] * 2 + 0.05 and j["energy_j"] > 0')
if [ "$v" = True ]; then
    ok "cpu_s > 0 for a CPU-burning command ($(jq_last "$T/out3" 'j["cpu_s"]') s)"
else
    fail "cpu_s of a CPU-burning command"
    tail -n 1 "$T/out3"
fi

# 4. Exit status passthrough, and 128+N for a signal.
"$EMLIO" energy -- sh -c 'exit 7' >"$T/out4" 2>/dev/null
rc=$?
if [ $rc -eq 7 ] && [ "$(jq_last "$T/out4" 'j["exit_code"]')" = 7 ]; then
    ok "exit status 7 passed through"
else
    fail "exit status passthrough (rc=$rc)"
fi
"$EMLIO" energy -- sh -c 'kill -KILL $$' >"$T/out4b" 2>/dev/null
rc=$?
if [ $rc -eq 137 ] && [ "$(jq_last "$T/out4b" 'j["exit_code"]')" = 137 ]; then
    ok "killed command gives 128+9"
else
    fail "killed command (rc=$rc)"
fi
"$EMLIO" energy -- "$T/does-not-exist" >/dev/null 2>"$T/err4c"
rc=$?
if [ $rc -eq 127 ] && grep -q "cannot run" "$T/err4c"; then
    ok "missing command gives 127"
else
    fail "missing command (rc=$rc)"
fi

# 5. stdin passthrough.
out=$(echo "from stdin" | "$EMLIO" energy -- cat 2>/dev/null | head -n 1)
if [ "$out" = "from stdin" ]; then
    ok "stdin and stdout pass through"
else
    fail "stdin passthrough: '$out'"
fi

# 6. SIGTERM to emlio reaches the command.
"$EMLIO" energy -- sleep 30 >"$T/out6" 2>/dev/null &
epid=$!
PIDS+=("$epid")
deadline=$((SECONDS + 10))
while ! pgrep -P "$epid" >/dev/null && [ $SECONDS -le $deadline ]; do
    sleep 0.02
done
kill -TERM "$epid"
t0=$SECONDS
wait "$epid"
rc=$?
if [ $rc -eq 143 ] && [ $((SECONDS - t0)) -lt 10 ] &&
    [ "$(jq_last "$T/out6" 'j["exit_code"]')" = 143 ]; then
    ok "SIGTERM forwarded to the command, report still printed"
else
    fail "SIGTERM forwarding (rc=$rc)"
fi

# 7. Synthetic RAPL tree: a background process advances the package counter
#    through a wrap while the command runs. 9.0 -> 9.5 -> (wrap at 10 J)
#    1.0 -> 3.0 J: 0.5 + (0.5 + 1.0 + 1 uJ) + 2.0 = 4.000001 J, however the
#    sampler interleaves (there is exactly one wrap); dram adds 0.25 J.
rapl=$T/powercap
mkdir -p "$rapl/intel-rapl:0" "$rapl/intel-rapl:0:0"
put() { # put FILE VALUE: atomic replace, as a sysfs reader expects
    echo "$2" >"$1.tmp" && mv "$1.tmp" "$1"
}
put "$rapl/intel-rapl:0/name" package-0
put "$rapl/intel-rapl:0/max_energy_range_uj" 10000000
put "$rapl/intel-rapl:0/energy_uj" 9000000
put "$rapl/intel-rapl:0:0/name" dram
put "$rapl/intel-rapl:0:0/max_energy_range_uj" 10000000
put "$rapl/intel-rapl:0:0/energy_uj" 100
(
    deadline=$((SECONDS + 20))
    while [ ! -e "$T/go" ] && [ $SECONDS -le $deadline ]; do sleep 0.01; done
    for v in 9500000 1000000 3000000; do
        put "$rapl/intel-rapl:0/energy_uj" $v
        sleep 0.05
    done
    put "$rapl/intel-rapl:0:0/energy_uj" 250100
    touch "$T/done"
) &
PIDS+=($!)
EMLIO_POWERCAP_ROOT=$rapl "$EMLIO" energy --interval 10 --gpu off -- \
    sh -c "touch '$T/go'; d=\$((\$(date +%s) + 20)); while [ ! -e '$T/done' ] && [ \$(date +%s) -le \$d ]; do sleep 0.01; done" \
    >"$T/out7" 2>"$T/err7"
rc=$?
v=$(jq_last "$T/out7" 'j["energy_source"] == "rapl" and not j["modelled"] and abs(j["energy_j"] - 4.250001) < 1e-6 and [(d["name"], d["source"], d["wraps"]) for d in j["domains"]] == [("package-0", "rapl", 1), ("dram-0", "rapl", 0)]')
if [ $rc -eq 0 ] && [ "$v" = True ]; then
    ok "synthetic rapl tree: energy_source rapl, 4.250001 J with one wrap"
else
    fail "synthetic rapl tree (rc=$rc)"
    cat "$T/err7"
    tail -n 1 "$T/out7"
fi

# 8. An explicit backend that is not there is an error, not a silent model.
put "$rapl/intel-rapl:0/energy_uj" garbage
EMLIO_POWERCAP_ROOT=$rapl "$EMLIO" energy --backend rapl -- true \
    >/dev/null 2>"$T/err8"
rc=$?
if [ $rc -eq 1 ] && grep -q "intel-rapl:0/energy_uj" "$T/err8"; then
    ok "--backend rapl on a garbled tree fails and names the file"
else
    fail "--backend rapl on a garbled tree (rc=$rc)"
    cat "$T/err8"
fi

# 9. Model parameters from the command line.
"$EMLIO" energy --backend model --gpu off --model-idle-w 0 --model-core-w 0 \
    -- true >"$T/out9" 2>/dev/null
if [ "$(jq_last "$T/out9" 'j["energy_source"] == "model" and j["energy_j"] == 0')" = True ]; then
    ok "--model-idle-w 0 --model-core-w 0 gives 0 J"
else
    fail "model options"
    tail -n 1 "$T/out9"
fi

# 10. Usage errors exit 2.
"$EMLIO" energy >/dev/null 2>&1
rc1=$?
"$EMLIO" energy --interval -5 -- true >/dev/null 2>&1
rc2=$?
"$EMLIO" energy --bogus 1 -- true >/dev/null 2>&1
rc3=$?
if [ $rc1 -eq 2 ] && [ $rc2 -eq 2 ] && [ $rc3 -eq 2 ]; then
    ok "usage errors exit 2"
else
    fail "usage errors ($rc1 $rc2 $rc3)"
fi

finish
