#!/usr/bin/env bash
# The GPU queue on a real GPU: two demo runs queued for GPU 0 run one after the other, the
# second waiting (`tunedeck queue`) while the first holds it; NVML's process list shows one
# run's ranks on the GPU at a time. Prints each run's queue record (GPUs taken, when started,
# when ended) and checks the two never overlapped. Results: docs/benchmarks.md.
# Usage (device machine, repo root): bash bench/queue_gpu.sh OUTDIR
set -uo pipefail
OUT=${1:?output dir}
mkdir -p "$OUT"
export TUNEDECK_HOME="$OUT/home" TUNEDECK_CACHE="$OUT/cache" PYTHONPATH="$(python3 bench/checkout.py)${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
td() { python3 -m tunedeck.cli "$@"; }

nvidia-smi --query-gpu=index,name,memory.total --format=csv
ids=()
for name in qgpu-a qgpu-b; do
  ids+=("$(td launch presets/demo.toml --queue --no-preflight --name "$name" \
    --set 'cluster.gpus="0"' --set cluster.nproc_per_node=1 --set train.max_steps=300 \
    --set train.save_steps=0)")
done
echo "launched ${ids[*]}"
for _ in $(seq 1 600); do
  echo "--- $(date +%T)"; td queue
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
  done=1
  for r in "${ids[@]}"; do
    s=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["status"])' "$TUNEDECK_HOME/runs/$r/state.json")
    case "$s" in succeeded|failed|stopped) ;; *) done=0 ;; esac
  done
  [ $done = 1 ] && break
  sleep 2
done
python3 - "$TUNEDECK_HOME/runs" "${ids[@]}" <<'PY'
import json, sys
root, ids = sys.argv[1], sys.argv[2:]
st = [json.load(open(f"{root}/{r}/state.json")) for r in ids]
for s in st:
    q = s.get("queue") or {}
    print(s["run_id"], s["status"], "gpus", q.get("gpus"), "started", q.get("started"), "ended", s.get("ended"))
a, b = st
print("one after the other:", b["queue"]["started"] >= a["ended"])
PY
