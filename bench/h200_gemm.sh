#!/usr/bin/env bash
# How the persistent kernel's output leaves (TUNEDECK_LORA_GEMM: masked pointer stores, TMA
# stores, TMA stores with a warp-specialized tile loop), in one device call (carry .gpu, and
# bench/anchor with Unsloth's wheels for unsloth-1; ~5 min a part with a warm machine):
#   bash bench/h200_gemm.sh OUTDIR
# GEMM_MICRO: the bench/lora_triton.py runs, space-separated --modes values, each its own process
# (a kernel the compiler cannot build must not take the others with it); "" skips them.
# GEMM_CASES: the trainer-bench cases, 7B preset in bf16, 3 warm-up + 8 timed steps each, each
# case's table and log (and a -profile case's profile.txt) copied to OUTDIR as it ends.
# Each part's SM clock and power are sampled (OUTDIR/*-clocks.jsonl) and summed up after it: a
# kernel timed alone runs at the boost clock, a whole step may not.
set -uo pipefail
OUT=${1:?usage: h200_gemm.sh OUTDIR}
cd "$(dirname "$0")/.."
source bench/gpu_site.sh
gpu_site || exit 1
mkdir -p "$OUT"
rm -rf /tmp/gemm  # a warm machine keeps the last call's cases
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv,noheader
python3 -c 'import torch, triton; print(torch.__version__, "triton", triton.__version__)'
for modes in ${GEMM_MICRO-persistent,tma ws}; do
  clocks_on "$OUT/micro-${modes//,/-}-clocks.jsonl"
  timeout 240 python3 bench/lora_triton.py --modes "$modes" --json "$OUT/micro-${modes//,/-}.json" \
    2>&1 | grep -v -i "warn" | tee "$OUT/micro-${modes//,/-}.txt"
  clocks_off "$OUT/micro-${modes//,/-}-clocks.jsonl"
  echo "$modes: $SECONDS s"
done
# GEMM_LAYER: epilogues for bench/swiglu_layer.py (one compiled 7B layer each, GPU time and
# gradients against the first); "" (the default) skips it
if [[ -n ${GEMM_LAYER:-} ]]; then
  clocks_on "$OUT/layer-clocks.jsonl"
  timeout 400 python3 bench/swiglu_layer.py --epilogues "$GEMM_LAYER" --json "$OUT/layer.json" \
    2>&1 | grep -v -i "warn" | tee "$OUT/layer.txt"
  clocks_off "$OUT/layer-clocks.jsonl"
  echo "layer: $SECONDS s"
fi
i=0
for c in ${GEMM_CASES-ours-default-1-bf16-gemmtma ours-default-1-bf16 unsloth-1}; do
  i=$((i + 1))
  clocks_on "$OUT/$i-$c-clocks.jsonl"
  CASE_TIMEOUT=200 bash bench/trainer_bench.sh /tmp/gemm/t 3 8 "$c" 2>&1 | tail -3
  clocks_off "$OUT/$i-$c-clocks.jsonl"
  python3 bench/trainer_bench.py table /tmp/gemm/t --warmup 3 > "$OUT/table-$i.md"
  cp /tmp/gemm/t/"$c"/run.log "$OUT/$i-$c.log" 2>/dev/null
  cp /tmp/gemm/t/"$c"/profile.txt "$OUT/$i-$c-profile.txt" 2>/dev/null  # the -profile cases
  [[ -f /tmp/gemm/t/$c/events/rank0.jsonl ]] && case_losses /tmp/gemm/t/"$c"/events/rank0.jsonl
  echo "$c: $SECONDS s"
done
[[ $i -gt 0 ]] && cat "$OUT/table-$i.md"
grep -ih "error\|fused" /tmp/gemm/t/*/run.log 2>/dev/null | head -8
echo "total: $SECONDS s"
