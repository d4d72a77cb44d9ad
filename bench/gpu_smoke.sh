#!/usr/bin/env bash
# The GPU-only paths of the walking skeleton, on a lent H200 machine, in one go:
# NVML discovery, the demo through `tunedeck launch --wait` over NCCL on every GPU, metrics,
# logs, a graceful stop with a checkpoint, a hard stop, and proof that no process keeps a GPU.
# Usage (device machine, repo root): bash bench/gpu_smoke.sh OUTDIR
set -uo pipefail
OUT=${1:?output dir}
mkdir -p "$OUT"
export TUNEDECK_HOME="$OUT/home" TUNEDECK_CACHE="$OUT/cache" PYTHONPATH="$(python3 bench/checkout.py)${PYTHONPATH:+:$PYTHONPATH}"
# NVLink multicast stays off on shared hosts
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
td() { python3 -m tunedeck.tui "$@"; }
step() { echo; echo "=== $*"; }

step "machine"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
python3 -c 'import torch, transformers, peft; print("torch", torch.__version__, "cuda", torch.cuda.device_count(), "nccl", torch.cuda.nccl.version(), "transformers", transformers.__version__, "peft", peft.__version__)'

step "NVML discovery (tunedeck.core.telemetry.gpus)"
python3 -c 'from tunedeck.core.telemetry.gpus import list_gpus, visible_gpu_count; print(list_gpus()); print("visible", visible_gpu_count())'

step "dry run: what the demo resolves to here"
td launch presets/demo.toml --dry-run --set env.NCCL_DEBUG=INFO

step "demo to the end: launch --wait (NCCL, every GPU)"
start=$(date +%s.%N)
td launch presets/demo.toml --wait --json --set env.NCCL_DEBUG=INFO > "$OUT/launch.json"
echo "exit code $? in $(python3 -c "print(round($(date +%s.%N)-$start,1))") s"
RUN=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["run_id"])' "$OUT/launch.json")
td status "$RUN"
td metrics "$RUN" --json > "$OUT/metrics.json"
python3 - "$OUT/metrics.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
print(f"{len(m)} steps; loss first {m[0]['loss']:.4f} last {m[-1]['loss']:.4f}; "
      f"median step {sorted(r['step_s'] for r in m)[len(m)//2]*1000:.1f} ms; "
      f"peak mem {max(r['mem_gib'] for r in m):.3f} GiB")
PY
echo "-- rank 0 log (tail)"; td logs "$RUN" -n 5
LAST=$(( $(nvidia-smi -L | wc -l) - 1 ))
echo "-- NCCL lines in rank $LAST's log"; td logs "$RUN" --rank "$LAST" -n 400 | grep -E "NCCL INFO (Init COMPLETE|Channel 00|Using network|comm 0x)" | head -6

step "graceful stop mid-run"
RUN2=$(td launch presets/demo.toml --set train.max_steps=100000 --set train.save_steps=0 --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["run_id"])')
for i in $(seq 1 120); do s=$(td status "$RUN2" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["step"])'); [ "$s" -ge 20 ] && break; sleep 0.5; done
echo "-- GPU processes while running"; nvidia-smi --query-compute-apps=pid,used_memory --format=csv
echo "-- the rank's stacks, asked through its request file (no signal)"
ls "$TUNEDECK_HOME/runs/$RUN2/stacks/"
td stacks "$RUN2" | grep -E "^=== rank|File .*(trainer|__main__)\.py" | head -8
td stop "$RUN2" --wait
python3 - "$TUNEDECK_HOME/runs/$RUN2" <<'PY'
import json, sys, pathlib
d = pathlib.Path(sys.argv[1])
ends = [json.loads(l) for f in sorted(d.glob("events/rank*.jsonl")) for l in open(f) if '"end"' in l]
print("end events:", [(e["rank"], e["step"], e["reason"]) for e in ends])
print("checkpoints:", sorted(p.name for p in (d / "output").glob("checkpoint-*")))
PY
echo "-- GPU processes after stop"; nvidia-smi --query-compute-apps=pid,used_memory --format=csv

step "hard stop mid-run"
RUN3=$(td launch presets/demo.toml --set train.max_steps=100000 --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["run_id"])')
sleep 15
td stop "$RUN3" --hard --wait
echo "-- GPU processes after hard stop"; nvidia-smi --query-compute-apps=pid,used_memory --format=csv
td ls

step "TUI (Pilot) on this machine"
python3 -m pytest -q -p no:cacheprovider tests/test_tui.py -k "runs_list_then_monitor" 2>&1 | tail -25

tar czf "$OUT/runs.tgz" --exclude='*.safetensors' --exclude='*.pt' -C "$OUT" home
rm -rf "$OUT/home" "$OUT/cache"
