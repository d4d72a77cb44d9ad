#!/usr/bin/env bash
# The adapter's and the loss's kernels checked and timed in one device call (repo root on the
# GPU machine):
#   bash bench/h200_adapter.sh OUTDIR [CASES]
# 1. the in-place adapter and fp8's custom ops against eager (bench/fp8_check.py);
# 2. each way the adapter can meet a 7B projection's frozen GEMM, timed alone (bench/lora_gemm.py);
# 3. the loss's compiled chunk math against eager (bench/ce_chunk.py);
# 4. trainer cases against the defaults they were chosen over: 'after' in bf16, the fp8 adapter
#    out of place, the loss eager in both (bench/trainer_bench.sh).
# Wheels as for bench/h200_speed.sh (.gpu/ carried): run(carry=[".gpu"], command=...).
# Whatever turns out to pay is then run beside Unsloth by bench/h200_speed.sh.
set -uo pipefail
OUT=${1:?usage: h200_adapter.sh OUTDIR [CASES]}
CASES=${2:-ours-default-1-bf16-after,ours-default-1-bf16-eagerce,ours-default-1-fp8-addmm,ours-default-1-fp8-eagerce}
cd "$(dirname "$0")/.."
source bench/gpu_site.sh
gpu_site || exit 1
W=/tmp/h200
rm -rf "$W/t" && mkdir -p "$W" "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
T0=$SECONDS
step() { echo "== $* ($((SECONDS - T0)) s)"; }
step fp8_check; timeout 150 python3 bench/fp8_check.py cuda 2>&1 | tail -30
step lora_gemm; timeout 120 python3 bench/lora_gemm.py --json "$OUT/lora_gemm.json" 2>&1 | tail -30
step ce_chunk; timeout 90 python3 bench/ce_chunk.py 2>&1 | tail -20
step trainer cases
CASE_TIMEOUT=${CASE_TIMEOUT:-130} bash bench/trainer_bench.sh "$W/t" 3 8 "$CASES"
cp "$W/t/table.md" "$OUT/" 2>/dev/null && cat "$OUT/table.md"
tar czf "$OUT/results.tgz" -C "$W" --exclude='*.safetensors' --exclude='qwen2.5-7b-random' \
  --exclude='cache' --exclude='output' t 2>/dev/null
step total
