#!/usr/bin/env bash
# One Triton kernel a LoRA linear (TUNEDECK_LORA_EPILOGUE=triton, core/train/lora_triton.py)
# against the default ("op"), in one device call (carry .gpu; ~6 min with a warm machine):
#   bash bench/h200_triton.sh OUTDIR
# bench/lora_triton.py (per projection of a 7B layer: cuBLAS bare, op, Triton bare and fused,
# every config), then the 7B preset in bf16 through the trainer bench both ways (3 warm-up + 5
# timed steps each; the kernel autotunes during the warm-up). The fp8 base's kernel:
#   TRITON_MODES=fp8 TRITON_CASES=ours-default-1-fp8-triton,ours-default-1-fp8 bash bench/h200_triton.sh OUTDIR
# TRITON_BENCH_S (default 360) bounds the trainer cases together.
# (cases with fp8 first run bench/fp8_check.py, the fp8 layers' gradients eager and compiled).
set -uo pipefail
OUT=${1:?usage: h200_triton.sh OUTDIR}
cd "$(dirname "$0")/.."
source bench/gpu_site.sh
gpu_site || exit 1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [[ ${TRITON_MICRO:-1} == 1 ]]; then  # TRITON_MICRO=0 skips it; TRITON_MODES adds persistent-loop,epilogue,loop,fp8,wide
  timeout 200 python3 bench/lora_triton.py --modes "${TRITON_MODES:-persistent}" --json "$OUT/triton.json" 2>&1 | grep -v -i "warn"
  echo "gemms: $SECONDS s"
fi
CASES=${TRITON_CASES:-ours-default-1-bf16-triton,ours-default-1-bf16}
[[ $CASES == *fp8* ]] && timeout 120 python3 bench/fp8_check.py cuda 2>&1 | grep -v -i "warn"
CASE_TIMEOUT=260 timeout "${TRITON_BENCH_S:-360}" bash bench/trainer_bench.sh "$OUT/t" 3 5 \
  "$CASES" 2>&1 | tail -4
cat "$OUT/t/table.md" 2>/dev/null
grep -ih "error" "$OUT"/t/*/run.log 2>/dev/null | head -5
case_losses "$OUT"/t/*/events/rank0.jsonl  # the same data and seed: the losses should agree
echo "total: $SECONDS s"
