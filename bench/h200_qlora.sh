#!/usr/bin/env bash
# The fused 4-bit LoRA layer on one GPU, in one device call (carry .gpu):
#   bash bench/h200_qlora.sh OUTDIR [all|drop]
# bench/qlora_check.py (loss and gradients against peft's 4-bit layers, eager and compiled; with
# dropout, 4-bit and 16-bit, against peft's layers replaying the masks),
# then the 7B QLoRA recipe through `tunedeck launch`, fused (the default) and through peft's
# layers (TUNEDECK_FUSED_LORA=0): tokens/s, NVML peak, the estimate beside it. RECIPES: without
# dropout (the default, ~300 s in all) or with dropout 0.05 too (`all`, ~450 s); `drop`: the
# fused layers only, without and with dropout (~300 s).
set -uo pipefail
OUT=${1:?usage: h200_qlora.sh OUTDIR [all|drop]}
RECIPES=qlora-7b-nodrop:builtin,qlora-7b-nodrop-peft:builtin
[[ ${2:-} == all ]] && RECIPES+=,qlora-7b:builtin,qlora-7b-peft:builtin
[[ ${2:-} == drop ]] && RECIPES=qlora-7b-nodrop:builtin,qlora-7b:builtin
cd "$(dirname "$0")/.."
T0=$SECONDS
source bench/gpu_site.sh
gpu_site || exit 1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import torch, transformers, peft, bitsandbytes; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'bitsandbytes', bitsandbytes.__version__)"
timeout 300 python3 bench/qlora_check.py "$OUT" 2>&1 | grep -v "^Loading\|^Writing" | tail -12
echo "check: $((SECONDS - T0)) s"
python3 bench/recipes_vs_swift.py /tmp/h200q/r --recipes "$RECIPES" 2>&1 \
  | grep -v "^Loading\|^Writing" \
  | tee "$OUT/recipes.log" | grep -E '^\{"recipe|^\||model folder|Error|error' | tail -12
cp /tmp/h200q/r/recipes.json /tmp/h200q/r/recipes.md "$OUT/" 2>/dev/null
echo "total: $((SECONDS - T0)) s"
