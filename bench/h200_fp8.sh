#!/usr/bin/env bash
# method.fp8_base on one H200, in one device call (~300 s with the install):
#   bash bench/h200_fp8.sh OUTDIR [STEPS]
# 1. bench/fp8_check.py: the fp8 layer's gradients eager and compiled on a small model
#    (stops here if the compiled gradients are off: a speed without them means nothing);
# 2. the trainer bench's 7B preset case in bf16 and with method.fp8_base;
# 3. the 7B preset through `tunedeck launch`, STEPS steps each way on the same data, and the
#    two loss curves side by side (bench/builtin_7b_launch.py).
# Wheels as for bench/h200_recipes.sh (.gpu/, carried).
set -uo pipefail
OUT=${1:?usage: h200_fp8.sh OUTDIR [STEPS]}
STEPS=${2:-30}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
source bench/gpu_site.sh
gpu_site || exit 1
python3 bench/fp8_check.py cuda 2>&1 | grep -v -i "warn" | tee "$OUT/fp8_check.txt"
if ! grep -q "^committed compile=True: .*0 of .* missing" "$OUT/fp8_check.txt" \
   || grep -q "^committed compile=True: .*grad norm 0.0000" "$OUT/fp8_check.txt"; then
  echo "fp8 layer's compiled gradients are off: no speed measured"; exit 1
fi
CASE_TIMEOUT=200 bash bench/trainer_bench.sh /tmp/h200f/t 3 8 ours-default-1,ours-default-1-fp8
cp /tmp/h200f/t/table.txt "$OUT/trainer_table.txt" 2>/dev/null
for v in bf16 fp8; do
  extra=()
  [[ $v == fp8 ]] && extra=(--set method.fp8_base=true)
  timeout 240 python3 bench/builtin_7b_launch.py /tmp/h200f/l --steps "$STEPS" --name "$v" \
    "${extra[@]}" 2>&1 | tail -1
done
cp /tmp/h200f/l/bf16.json /tmp/h200f/l/fp8.json "$OUT/" 2>/dev/null
python3 - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
a, b = (json.load(open(f"{out}/{v}.json")) for v in ("bf16", "fp8"))
print("step  bf16 loss  fp8 loss  diff")
for i, (x, y) in enumerate(zip(a["losses"], b["losses"]), 1):
    print(f"{i:4}  {x:9.4f}  {y:8.4f}  {y - x:+.4f}")
for v, d in (("bf16", a), ("fp8", b)):
    print(v, {k: d.get(k) for k in ("tokens_per_s_metrics", "label_tokens_per_s_events",
                                     "mfu_events", "mem_reserved_gib")})
EOF
