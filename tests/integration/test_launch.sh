#!/usr/bin/env bash
# test_launch.sh - the deployment examples, run here against two daemons
# that each hold half of a dataset: examples/slurm_fetch.sbatch started the
# way sbatch and srun start it (a stand-in srun that sets the variables
# Slurm sets for each task), and examples/torchrun_loader.sh with the real
# torchrun when it is installed, plus examples/torchrun_rank.py with the
# variables torchrun sets. Every sample must reach exactly one rank per
# epoch, across all ranks.
# Run from the repo root with B=<build dir>.
set -u
. tests/integration/lib.sh

SAMPLES=90
# Under `make check` the library is sanitized: Python needs the runtimes
# preloaded (leak checks off: CPython keeps memory to the end).
PYENV=(env)
if [ -n "${EMLIO_PY_PRELOAD:-}" ]; then
    PYENV=(env LD_PRELOAD="$EMLIO_PY_PRELOAD"
        ASAN_OPTIONS="detect_leaks=0:halt_on_error=1")
fi
make_dataset "$T/ds" $SAMPLES 3 2000 16K || fail "dataset"
mkdir -p "$T/half2"
n=0
for f in "$T"/ds/shards/*.tfrecord; do
    n=$((n + 1))
    [ $((n % 2)) -eq 0 ] && mv "$f" "$f.idx" "$T/half2/" 2>/dev/null
done
check "the dataset is split over two directories" \
    bash -c "ls '$T/half2'/*.tfrecord >/dev/null && ls '$T/ds/shards'/*.tfrecord >/dev/null"
start_daemon d1 "$T/ds/shards" || fail "daemon 1"
EP1=$EP
start_daemon d2 "$T/half2" || fail "daemon 2"
EP2=$EP
DAEMONS=$EP1,$EP2

# exactly_once DIR EPOCHS: every epoch's non-padding ids over all ranks are
# the whole dataset, none twice.
exactly_once() {
    local e
    for e in $(seq 0 $(($2 - 1))); do
        cat "$1"/ids.* | awk -v e="$e" '$1 == e && $4 != "pad"' |
            sort >"$T/epoch.ids"
        [ "$(wc -l <"$T/epoch.ids")" -eq $SAMPLES ] || return 1
        [ -z "$(uniq -d "$T/epoch.ids")" ] || return 1
    done
}

# A stand-in for srun: starts SLURM_NTASKS copies of the command with the
# per-task variables Slurm sets, and fails if any task fails.
mkdir -p "$T/bin"
cat >"$T/bin/srun" <<'SH'
#!/usr/bin/env bash
[ "$1" = --kill-on-bad-exit=1 ] && shift
pids=()
for ((i = 0; i < SLURM_NTASKS; i++)); do
    SLURM_STEP_ID=0 SLURM_PROCID=$i SLURM_LOCALID=$((i % 2)) \
        SLURM_NODEID=$((i / 2)) SLURMD_NODENAME=node$((i / 2)) "$@" &
    pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
exit $rc
SH
chmod +x "$T/bin/srun"
# As sbatch runs the batch script: job variables, no step or task yet.
env PATH="$T/bin:$PATH" SLURM_JOB_ID=4242 SLURM_NTASKS=3 \
    SLURM_JOB_NUM_NODES=2 SLURM_NNODES=2 SLURM_STEP_ID=batch \
    EMLIO="$PWD/$EMLIO" EMLIO_DAEMONS="$DAEMONS" EMLIO_OUT="$T/slurm" \
    EMLIO_BATCH=8 EMLIO_EPOCHS=2 EMLIO_SEED=3 \
    bash examples/slurm_fetch.sbatch >"$T/slurm.out" 2>"$T/slurm.err"
check "slurm_fetch.sbatch: 3 tasks over 2 daemons succeed" test $? -eq 0 ||
    tail -5 "$T/slurm.err"
for r in 0 1 2; do
    f=$T/slurm/result.$r.json
    got="$(json_field "$f" rank 2>/dev/null) $(json_field "$f" world 2>/dev/null)"
    got+=" $(json_field "$f" verified 2>/dev/null)"
    check "slurm task $r: rank $r of 3, verified ($got)" test "$got" = "$r 3 True"
done
check "slurm: every sample to exactly one task, both epochs" \
    exactly_once "$T/slurm" 2
env -u SLURM_JOB_ID EMLIO_DAEMONS=x bash examples/slurm_fetch.sbatch \
    >/dev/null 2>&1
check "slurm_fetch.sbatch outside Slurm is a usage error" test $? -eq 2

# torchrun: the real launcher when it works here, else a stand-in that
# sets the variables torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, ...).
export B
cat >"$T/bin/torchrun" <<'SH'
#!/usr/bin/env bash
# Stand-in torchrun: --nproc_per_node N SCRIPT ARGS... on one node.
n=1
while [ $# -gt 0 ]; do
    case $1 in
    --nproc_per_node) n=$2; shift 2 ;;
    --nnodes | --node_rank | --rdzv_backend | --rdzv_endpoint) shift 2 ;;
    --standalone) shift ;;
    *) break ;;
    esac
done
pids=()
for ((i = 0; i < n; i++)); do
    RANK=$i WORLD_SIZE=$n LOCAL_RANK=$i LOCAL_WORLD_SIZE=$n GROUP_RANK=0 \
        ROLE_RANK=$i MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \
        TORCHELASTIC_RUN_ID=none /usr/bin/python3 "$@" &
    pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
exit $rc
SH
chmod +x "$T/bin/torchrun"
printf 'import os\nassert int(os.environ["WORLD_SIZE"]) == 1\n' >"$T/probe.py"
real_torchrun=""
if command -v torchrun >/dev/null &&
    timeout 60 torchrun --standalone --nnodes 1 --nproc_per_node 1 \
        "$T/probe.py" >"$T/probe.out" 2>&1; then
    real_torchrun=$(command -v torchrun)
else
    skip "the real torchrun does not run here ($(tail -n 1 "$T/probe.out" 2>/dev/null)); a stand-in setting its variables runs the example"
fi
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    mkdir -p "$T/torchrun"
    "${PYENV[@]}" EMLIO_DAEMONS="$DAEMONS" NPROC_PER_NODE=2 \
        TORCHRUN="${real_torchrun:-$T/bin/torchrun}" \
        OMP_NUM_THREADS=1 timeout 240 bash examples/torchrun_loader.sh \
        --batch 8 --epochs 2 --seed 5 --out "$T/torchrun" \
        >"$T/torchrun.out" 2>"$T/torchrun.err"
    check "torchrun_loader.sh: 2 ranks (${real_torchrun:-stand-in torchrun}) succeed" \
        test $? -eq 0 || tail -8 "$T/torchrun.err"
    check "torchrun: every sample to exactly one rank, both epochs" \
        exactly_once "$T/torchrun" 2
    check "torchrun gave the ranks 0 and 1 of 2" bash -c \
        "cat '$T/torchrun'/result.*.json | grep -o '\"world\": 2' | wc -l | grep -qx 2"
else
    skip "python3-torch not installed: torchrun_loader.sh"
fi

# The rank program with the variables torchrun sets, three ranks.
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    mkdir -p "$T/tr"
    pids=()
    for r in 0 1 2; do
        "${PYENV[@]}" RANK=$r WORLD_SIZE=3 LOCAL_RANK=$r LOCAL_WORLD_SIZE=3 \
            GROUP_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \
            TORCHELASTIC_RUN_ID=test /usr/bin/python3 examples/torchrun_rank.py \
            --connect "$DAEMONS" --batch 8 --epochs 2 --out "$T/tr" \
            >"$T/tr.$r.out" 2>&1 &
        pids+=($!)
    done
    rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    check "torchrun_rank.py with torchrun's variables: 3 ranks succeed" \
        test $rc -eq 0 || cat "$T"/tr.*.out | tail -8
    check "torchrun-style: every sample to exactly one rank, both epochs" \
        exactly_once "$T/tr" 2
else
    skip "python3-torch not installed: torchrun_rank.py"
fi

# Elastic restart: 3 ranks (batch 4) preempted after 2 batches each, the
# job restarted on 2 ranks (batch 6: the same global batch of 12) from
# every rank's state; the two runs together deliver the epoch once.
# ranks WORLD BATCH OUT ARGS...: one run of the rank program.
ranks() {
    local world=$1 batch=$2 out=$3 r
    shift 3
    mkdir -p "$out"
    local pids=() rc=0
    for r in $(seq 0 $((world - 1))); do
        "${PYENV[@]}" RANK=$r WORLD_SIZE=$world LOCAL_RANK=$r \
            /usr/bin/python3 examples/torchrun_rank.py --connect "$DAEMONS" \
            --batch "$batch" --epochs 1 --out "$out" "$@" >"$out/$r.log" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    [ $rc = 0 ] || tail -n 5 "$out"/*.log
    return $rc
}
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    # Batches of 6: each rank's 30 samples are 5 whole batches. With 4, a
    # rank's short last batch (2) could be handed over among the first two
    # (out of order: whichever arrives first) and the run stop at 22. The
    # global batch (18) is kept on 2 ranks: 9 each.
    check "elastic: 3 ranks stop after 2 batches, saving their states" \
        ranks 3 6 "$T/el1" --stop-after 2 --state-dir "$T/el1/states"
    check "elastic: 3 states saved" test "$(ls "$T/el1/states" | wc -l)" = 3
    check "elastic: the job restarts on 2 ranks from them" \
        ranks 2 9 "$T/el2" --resume-from "$T/el1/states"
    mkdir -p "$T/el"
    for d in el1 el2; do
        for f in "$T/$d"/ids.*; do cp "$f" "$T/el/ids.$d.${f##*.}"; done
    done
    check "elastic: the two runs delivered every sample exactly once" \
        exactly_once "$T/el" 1
    if [ "$(cat "$T/el1"/ids.* | wc -l)" = 36 ]; then
        ok "elastic: the first run stopped early"
    else
        fail "elastic: the first run stopped early"
        wc -l "$T/el1"/ids.*
        tail -n 3 "$T/el1"/*.log
    fi
else
    skip "python3-torch not installed: elastic restart of torchrun_rank.py"
fi
finish
