#!/usr/bin/env bash
# The adapters as extra K columns (TUNEDECK_LORA_EPILOGUE=kcat: MLPs and attention; kcat-mlp:
# MLPs only; core/train/lora_kcat.py) against the default ("op"), in one device call (carry
# .gpu; ~6 min with a warm machine):
#   bash bench/h200_kcat.sh OUTDIR
# bench/mlp_kcat.py (one compiled 7B MLP block, both ways, same machine: time, peak, gradients),
# bench/lora_kcat.py (the per-projection GEMMs, q/k/v merged), then the 7B preset in bf16 through
# the trainer bench three ways (3 warm-up + 5 timed steps each).
set -uo pipefail
OUT=${1:?usage: h200_kcat.sh OUTDIR}
cd "$(dirname "$0")/.."
source bench/gpu_site.sh
gpu_site || exit 1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [[ ${KCAT_MICRO:-1} == 1 ]]; then  # KCAT_MICRO=0 skips the block and GEMM benches (~1.5 min)
  timeout 120 python3 bench/mlp_kcat.py --json "$OUT/mlp.json" 2>&1 | grep -v -i "warn" | tail -4
  echo "block: $SECONDS s"
  timeout 60 python3 bench/lora_kcat.py --json "$OUT/kcat.json" 2>&1 | tail -3
  echo "gemms: $SECONDS s"
fi
CASE_TIMEOUT=110 timeout 340 bash bench/trainer_bench.sh "$OUT/t" 3 5 \
  ours-default-1-bf16-kcat,ours-default-1-bf16,ours-default-1-bf16-kcatmlp 2>&1 | tail -4
if [[ ${KCAT_AUTOTUNE:-0} == 1 ]]; then  # kcat again with Inductor's GEMM autotuning (~4 min)
  TUNEDECK_COMPILE_MODE=max-autotune-no-cudagraphs CASE_TIMEOUT=280 timeout 290 \
    bash bench/trainer_bench.sh "$OUT/a" 3 5 ours-default-1-bf16-kcat 2>&1 | tail -2
  cat "$OUT/a/table.md" 2>/dev/null
fi
cat "$OUT/t/table.md" 2>/dev/null
grep -ih "error" "$OUT"/t/*/run.log 2>/dev/null | head -5
case_losses "$OUT"/[ta]/*/events/rank0.jsonl  # the same data and seed: the losses should agree
echo "total: $SECONDS s"
