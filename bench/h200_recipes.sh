#!/usr/bin/env bash
# QLoRA / full fine-tuning against ms-swift and the fused-LoRA check, in one device call:
#   bash bench/h200_recipes.sh OUTDIR [RECIPES] [TRAINER_CASES] [--launch]
# Wheels (ms-swift 4.6 and its needs, textual, tomli-w, liger...) come in .gpu/*.whl and
# bitsandbytes unpacked as .gpu/bitsandbytes_pkg (its CUDA 13 library only), carried with the
# call. RECIPES go to bench/recipes_vs_swift.py (default qlora-7b,full-1.5b); TRAINER_CASES to
# bench/trainer_bench.sh (default none), e.g. ours-default-1,ours-default-1-peft; --launch runs
# the 7B preset through `tunedeck launch` (bench/builtin_7b_launch.py) on the recipes' 7B folder.
set -uo pipefail
OUT=${1:?usage: h200_recipes.sh OUTDIR [RECIPES] [TRAINER_CASES]}
RECIPES=${2:-qlora-7b,full-1.5b}
CASES=${3:-}
LAUNCH=${4:-}
cd "$(dirname "$0")/.."
T0=$SECONDS
source bench/gpu_site.sh
gpu_site || exit 1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
python3 -c "import torch, transformers, peft, swift, bitsandbytes; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'ms-swift', swift.__version__, 'bitsandbytes', bitsandbytes.__version__)"
echo "install: $((SECONDS - T0)) s"
W=/tmp/h200r
mkdir -p "$W" "$OUT"
if [[ -n $CASES ]]; then
  CASE_TIMEOUT=200 bash bench/trainer_bench.sh "$W/t" 3 8 "$CASES"
  cp "$W/t/table.txt" "$OUT/trainer_table.txt" 2>/dev/null
  echo "trainer cases: $((SECONDS - T0)) s"
fi
if [[ $RECIPES != none ]]; then
  python3 bench/recipes_vs_swift.py "$W/r" --recipes "$RECIPES" 2>&1 | tee "$OUT/recipes.log"
  cp "$W/r/recipes.json" "$W/r/recipes.md" "$OUT/" 2>/dev/null
fi
if [[ $LAUNCH == --launch ]]; then
  timeout 240 python3 bench/builtin_7b_launch.py "$W/launch" --model-root "$W/r/7b" \
    --steps 12 2>&1 | tail -40
  cp "$W/launch/launch.json" "$OUT/" 2>/dev/null
fi
tar czf "$OUT/results.tgz" -C "$W" --exclude='*.safetensors' --exclude='*-random' \
  --exclude='cache' --exclude='output' --exclude='ms' --exclude='hf' . 2>/dev/null
echo "total: $((SECONDS - T0)) s"
