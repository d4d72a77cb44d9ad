#!/usr/bin/env bash
# The rank-r products of a LoRA linear by core/train/lora_rank.py (TUNEDECK_LORA_RANK=dy, the
# default, or triton) against cuBLAS's, in one device call (carry .gpu; ~5 min with a warm machine):
#   bash bench/h200_rank.sh OUTDIR
# bench/lora_rank.py (per projection of a 7B layer: each kernel at every config, the whole
# linear each way), then the 7B preset in bf16 through the trainer bench: all of lora_rank's
# kernels, cuBLAS's, dy_pass alone, cuBLAS's again (3 warm-up + 8 timed steps each), each
# case's table copied to OUTDIR as it ends.
# RANK_MICRO=0 skips the per-projection part; RANK_CASES picks the trainer cases.
set -uo pipefail
OUT=${1:?usage: h200_rank.sh OUTDIR}
cd "$(dirname "$0")/.."
source bench/gpu_site.sh
gpu_site || exit 1
mkdir -p "$OUT"
rm -rf /tmp/rank  # a warm machine keeps the last call's cases
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c 'import torch, triton; print(torch.__version__, "triton", triton.__version__)'
if [[ ${RANK_MICRO:-1} == 1 ]]; then
  timeout 240 python3 bench/lora_rank.py --json "$OUT/rank.json" 2>&1 | grep -v -i "warn" \
    | tee "$OUT/rank.txt"
  echo "per projection: $SECONDS s"
fi
i=0  # a case named twice (the default again, for the spread) keeps each run's table
for c in ${RANK_CASES:-ours-default-1-bf16-rank ours-default-1-bf16 ours-default-1-bf16-rankdy ours-default-1-bf16}; do
  i=$((i + 1))
  CASE_TIMEOUT=160 bash bench/trainer_bench.sh /tmp/rank/t 3 8 "$c" 2>&1 | tail -3
  python3 bench/trainer_bench.py table /tmp/rank/t --warmup 3 > "$OUT/table-$i.md"
  cp /tmp/rank/t/"$c"/run.log "$OUT/$i-$c.log" 2>/dev/null
  case_losses /tmp/rank/t/"$c"/events/rank0.jsonl
done
cat "$OUT/table-$i.md"
grep -ih "error\|fused" /tmp/rank/t/*/run.log 2>/dev/null | head -8
echo "total: $SECONDS s"
