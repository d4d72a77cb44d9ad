#!/usr/bin/env bash
# Built-in trainer vs the plain-PyTorch anchor (bench/anchor/lora_baseline.py), one go.
#   bench/trainer_bench.sh OUTDIR [--tiny] [WARMUP] [STEPS] [CASES]
# GPU: Qwen2.5-7B architecture, random init, LoRA r=8 all-linear, bf16 autocast, SDPA,
# batch 4 x 2048, no gradient checkpointing; 1 GPU then 2; chat data padded vs packed; FSDP2
# full fine-tuning on 2 GPUs. --tiny: a tiny model on 2 CPU ranks, no anchor (script self-test).
# CASES: comma-separated names to run (default: all), from
#   anchor-1 anchor-2 ours-padded-1 ours-padded-1-nochunk ours-padded-1-compile ours-padded-2
#   ours-padded-2-compile ours-chat-padded-1 ours-chat-packed-1 ours-fsdp2-full-2
# e.g. bench/trainer_bench.sh OUT 3 10 anchor-1,ours-padded-1,anchor-2,ours-padded-2
set -euo pipefail
OUT=${1:?usage: trainer_bench.sh OUTDIR [--tiny] [WARMUP] [STEPS] [CASES]}
shift
TINY=0
if [[ "${1:-}" == "--tiny" ]]; then TINY=1; shift; fi
WARMUP=${1:-3}
STEPS=${2:-10}
CASES=${3:-all}
ALL="anchor-1 anchor-2 ours-padded-1 ours-padded-1-nochunk ours-padded-1-compile ours-padded-2
ours-padded-2-compile ours-chat-padded-1 ours-chat-packed-1 ours-fsdp2-full-2"
if [[ $CASES == all ]]; then CASES=$(echo $ALL | tr ' ' ,); fi
for c in ${CASES//,/ }; do
  [[ " $(echo $ALL) " == *" $c "* ]] || { echo "unknown case '$c'; known: $(echo $ALL)" >&2; exit 2; }
done
cd "$(dirname "$0")/.."
export PYTHONPATH="$(python3 bench/checkout.py)${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-python}
mkdir -p "$OUT"
port=$((29600 + RANDOM % 300))

trun() {  # trun NPROC NAME ARGS...: one torchrun case, its log in OUTDIR/NAME/
  local n=$1 name=$2; shift 2
  mkdir -p "$OUT/$name"
  port=$((port + 1))
  echo "== $name ($n ranks)"
  local t0=$SECONDS
  "$PY" -m torch.distributed.run --nproc_per_node "$n" --master_addr 127.0.0.1 \
    --master_port "$port" "$@" > "$OUT/$name/run.log" 2>&1 \
    || { echo "   FAILED, see $OUT/$name/run.log"; tail -5 "$OUT/$name/run.log"; }
  echo "   $((SECONDS - t0)) s"
}

if [[ $TINY == 1 ]]; then
  export OMP_NUM_THREADS=1
  common=(--size tiny --seq 128 --bs 4 --warmup "$WARMUP" --steps "$STEPS")
else
  common=(--size 7b --seq 2048 --bs 4 --warmup "$WARMUP" --steps "$STEPS")
fi
W=bench/trainer_bench.py
A=bench/anchor/lora_baseline.py

one() {  # one CASE
  local c=$1
  case $c in
    anchor-1|anchor-2)
      if [[ $TINY == 1 ]]; then echo "== $c skipped (--tiny: no anchor on CPU)"; return; fi
      mkdir -p "$OUT/$c"
      trun "${c#anchor-}" "$c" "$A" --size 7b --seq 2048 --bs 4 --rank 8 \
        --warmup "$WARMUP" --steps "$STEPS" --out "$OUT/$c" ;;
    ours-padded-1) trun 1 "$c" $W run --case padded "${common[@]}" --out "$OUT/$c" ;;
    # one head chunk for the whole micro-batch: what chunking costs or saves
    ours-padded-1-nochunk) TUNEDECK_LOSS_CHUNK=100000000 \
      trun 1 "$c" $W run --case padded "${common[@]}" --out "$OUT/$c" ;;
    ours-padded-1-compile) trun 1 "$c" $W run --case padded --compile "${common[@]}" --out "$OUT/$c" ;;
    ours-padded-2) trun 2 "$c" $W run --case padded "${common[@]}" --out "$OUT/$c" ;;
    ours-padded-2-compile) trun 2 "$c" $W run --case padded --compile "${common[@]}" --out "$OUT/$c" ;;
    ours-chat-padded-1) trun 1 "$c" $W run --case chat "${common[@]}" --out "$OUT/$c" ;;
    ours-chat-packed-1) trun 1 "$c" $W run --case packed "${common[@]}" --out "$OUT/$c" ;;
    ours-fsdp2-full-2) trun 2 "$c" $W run --case fsdp2 "${common[@]}" --out "$OUT/$c" ;;
  esac
}
for c in ${CASES//,/ }; do one "$c"; done
"$PY" $W table "$OUT" --warmup "$WARMUP" | tee "$OUT/table.txt"
