#!/usr/bin/env bash
# The single-H200 speed table of issue 17, in one device call (repo root on the GPU machine):
#   bash bench/h200_speed.sh OUTDIR [CASES] [--launch]
# Wheels (liger-kernel, textual, tomli-w...) and Unsloth come in .gpu/ (`bash bench/gpu_wheels.sh
# --speed`: with ms-swift's own wheels set aside, so the carry fits 64 MiB), the anchor as
# bench/anchor/ (copied from shared/anchors/lora_baseline.py):
#   run(carry=[".gpu", "bench/anchor"], command="bash bench/h200_speed.sh $OUT")
# Cases are bench/trainer_bench.sh's (the default: the table of issue 32); --launch also runs
# the 7B preset through `tunedeck launch` (bench/builtin_7b_launch.py).
# Everything lands in /tmp/h200 (a 15 GB model folder among it); OUTDIR gets table.md,
# results.tgz (events, logs, profiles) and launch.json.
set -uo pipefail
OUT=${1:?usage: h200_speed.sh OUTDIR [CASES] [--launch]}
CASES=${2:-ours-default-1-fp8,anchor-1,anchor-liger-1,unsloth-1,ours-default-1-bf16}
LAUNCH=${3:-}
cd "$(dirname "$0")/.."
source bench/gpu_site.sh
gpu_site || exit 1
W=/tmp/h200
mkdir -p "$W" "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)"
T0=$SECONDS
# cut short (a timeout): still leave the table of the cases that finished, and their files
trap 'python3 bench/trainer_bench.py table "$W/t" --warmup 3 > "$OUT/table.md" 2>&1;
  tar czf "$OUT/results.tgz" -C "$W" --exclude=qwen2.5-7b-random --exclude=cache \
  --exclude=output t 2>/dev/null' TERM
bash bench/trainer_bench.sh "$W/t" 3 8 "$CASES"
echo "bench: $((SECONDS - T0)) s"
for f in "$W"/t/*/profile.txt; do [[ -f $f ]] && { echo "== $f"; head -45 "$f"; }; done
for d in "$W"/t/*/; do
  grep -h "warning\|compiling\|Error" "$d"run.log 2>/dev/null | sort | uniq -c | head -5 | sed "s|^|$(basename "$d"): |"
done
if [[ $LAUNCH == --launch ]]; then
  timeout 300 python3 bench/builtin_7b_launch.py "$W/launch" --model-root "$W/t" --steps 10 2>&1 | tail -40
  cp "$W/launch/launch.json" "$OUT/" 2>/dev/null
fi
cp "$W/t/table.md" "$OUT/" 2>/dev/null
tar czf "$OUT/results.tgz" -C "$W" --exclude='*.safetensors' --exclude='qwen2.5-7b-random' \
  --exclude='cache' --exclude='output' t launch 2>/dev/null
echo "total: $((SECONDS - T0)) s"
