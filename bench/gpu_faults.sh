#!/usr/bin/env bash
# Real faults in real demo runs, launched through the real agent (NCCL on every GPU): a slow
# rank, a starved loader, a hung rank, a killed DataLoader worker, a killed rank. For each:
# what the agent found (and when), `tunedeck diagnose/metrics --json`, a stop, and proof with
# nvidia-smi that no process keeps a GPU. Each scenario lands in OUTDIR/<scenario>.tgz (its
# run directory without weights, diagnose/metrics JSON, a summary); tests/fixtures/h200/ is
# trimmed from them by `bench/fault_tools.py trim`.
# Usage (device machine, repo root): bash bench/gpu_faults.sh OUTDIR [SCENARIO ...]
# FAULTS_DEVICE=cpu runs the same scenarios on CPU (gloo, cluster.cpu_procs=2) to try them.
set -uo pipefail
OUT=${1:?output dir}
shift
SCENARIOS=${*:-slow_rank starved_loader loader_killed rank_killed hung_rank}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export TUNEDECK_HOME="$OUT/home" TUNEDECK_CACHE="$OUT/cache" PYTHONPATH="$(python3 bench/checkout.py)${PYTHONPATH:+:$PYTHONPATH}"
# NVLink multicast stays off on shared hosts
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
DEVICE=${FAULTS_DEVICE:-cuda}
PY=${PYTHON:-python3}
td() { "$PY" -m tunedeck.tui "$@"; }
fx() { "$PY" bench/fault_tools.py "$@"; }
step() { echo; echo "=== $* ($(date +%T))"; }
gpu_procs() {
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv
  else
    echo "(no nvidia-smi here)"
  fi
}

# launch NAME [--set ...]: a long demo run (stopped by the scenario), prints its run dir
launch() {
  local name=$1
  shift
  td launch presets/demo.toml --json --set "name=$name" --set "cluster.device=$DEVICE" \
    --set train.max_steps=100000 --set train.save_steps=0 --set run.stop_grace_s=10 "$@" |
    "$PY" -c 'import json,sys; print(json.load(sys.stdin)["run_dir"])'
}

# finish NAME RUN: stop (graceful, then hard if it did not end), GPUs after, records
finish() {
  local name=$1 run=$2 id
  id=$(basename "$run")
  if ! fx ended "$run"; then
    td stop "$id" || td stop "$id" --hard
  fi
  fx wait-end "$run" 30 || td stop "$id" --hard
  echo "-- GPU processes after stop"; gpu_procs
  mkdir -p "$OUT/res/$name"
  td diagnose "$id" --json > "$OUT/res/$name/diagnose.json"
  td metrics "$id" --json > "$OUT/res/$name/metrics.json"
  echo "-- diagnose"; td diagnose "$id" | grep -E '^\[' || echo "(no findings)"
  echo "-- summary"; fx summary "$run" | tee "$OUT/res/$name/summary.txt" | grep -v '^{'
  # one archive per scenario, so a later scenario running out of time loses nothing
  tar czf "$OUT/$name.tgz" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.bin' \
    --exclude='output' -C "$OUT" "home/runs/$id" "res/$name"
}

slow_rank() {
  step "slow rank: rank 1's forward takes 50 ms more (TUNEDECK_TEST_SLOW_RANK=1:0.05)"
  RUN=$(TUNEDECK_TEST_SLOW_RANK=1:0.05 launch fx-slow-rank)
  fx wait-finding "$RUN" straggler 150
  fx wait-step "$RUN" 150 60   # enough steps for per-rank medians
  echo "-- GPU processes while running"; gpu_procs
  finish slow_rank "$RUN"
}

starved_loader() {
  step "starved loader: rank 1 waits 0.3 s more per batch (TUNEDECK_TEST_LOADER_DELAY=1:0.3)"
  RUN=$(TUNEDECK_TEST_LOADER_DELAY=1:0.3 launch fx-starved-loader)
  fx wait-finding "$RUN" dataloader_starvation 150
  sleep 20  # past the warm-up steps: steady-state timings and telemetry with the dip
  finish starved_loader "$RUN"
}

hung_rank() {
  step "hung rank: rank 1 stops after step 30; collective timeout 20 s; stall floor 10 s"
  RUN=$(TUNEDECK_STALL_FLOOR_S=10 TUNEDECK_TEST_HANG_RANK=1:30 launch fx-hung-rank \
        --set cluster.collective_timeout_s=20)
  fx wait-finding "$RUN" stall 150
  # while it hangs: every rank's stack (the hung one is not inside a collective)
  mkdir -p "$OUT/res/hung_rank"
  echo "-- tunedeck stacks"
  td stacks "$(basename "$RUN")" | tee "$OUT/res/hung_rank/stacks.txt" |
    grep -E '^=== |_test_hang|backward' | head -12
  fx wait-finding "$RUN" nccl_timeout 90
  # the watchdog aborts rank 0 (after its debug dump); torchrun then stops rank 1
  fx wait-end "$RUN" 150
  finish hung_rank "$RUN"
}

loader_killed() {
  step "killed DataLoader worker: SIGKILL to rank 1's worker (data.num_workers=1)"
  RUN=$(launch fx-loader-killed --set data.num_workers=1)
  fx wait-step "$RUN" 20 150
  fx kill "$RUN" 1 loader
  fx wait-finding "$RUN" dataloader_worker_killed 90
  fx wait-end "$RUN" 90
  finish loader_killed "$RUN"
}

rank_killed() {
  step "killed rank: SIGKILL to rank 1"
  RUN=$(launch fx-rank-killed)
  fx wait-step "$RUN" 20 150
  fx kill "$RUN" 1 rank
  fx wait-finding "$RUN" worker_sigkill 90
  fx wait-end "$RUN" 90
  finish rank_killed "$RUN"
}

step "machine"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
fi
"$PY" -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count())'
t_all=$(date +%s)
for s in $SCENARIOS; do
  t0=$(date +%s)
  "$s"
  echo "-- $s took $(( $(date +%s) - t0 )) s"
done

step "all runs"
td ls
echo "-- GPU processes at the end"; gpu_procs
echo "total $(( $(date +%s) - t_all )) s"
rm -rf "$OUT/home" "$OUT/cache" "$OUT/res"
ls -la "$OUT"
