#!/usr/bin/env bash
# Built-in trainer vs the plain-PyTorch anchor (bench/anchor/lora_baseline.py), one go.
#   bench/trainer_bench.sh OUTDIR [--tiny] [WARMUP] [STEPS]
# GPU: Qwen2.5-7B architecture, random init, LoRA r=8 all-linear, bf16 autocast, SDPA,
# batch 4 x 2048, no gradient checkpointing; 1 GPU then 2; chat data padded vs packed; FSDP2
# full fine-tuning on 2 GPUs. --tiny: a tiny model on 2 CPU ranks, no anchor (script self-test).
set -euo pipefail
OUT=${1:?usage: trainer_bench.sh OUTDIR [--tiny] [WARMUP] [STEPS]}
shift
TINY=0
if [[ "${1:-}" == "--tiny" ]]; then TINY=1; shift; fi
WARMUP=${1:-3}
STEPS=${2:-10}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
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
  "$PY" -m torch.distributed.run --nproc_per_node "$n" --master_addr 127.0.0.1 \
    --master_port "$port" "$@" > "$OUT/$name/run.log" 2>&1 \
    || { echo "   FAILED, see $OUT/$name/run.log"; tail -5 "$OUT/$name/run.log"; }
}

if [[ $TINY == 1 ]]; then
  export OMP_NUM_THREADS=1
  common=(--size tiny --seq 128 --bs 4 --warmup "$WARMUP" --steps "$STEPS")
  G1=1; G2=2
else
  common=(--size 7b --seq 2048 --bs 4 --warmup "$WARMUP" --steps "$STEPS")
  G1=1; G2=2
  A=bench/anchor/lora_baseline.py
  for n in $G1 $G2; do
    mkdir -p "$OUT/anchor-$n"
    trun "$n" "anchor-$n" "$A" --size 7b --seq 2048 --bs 4 --rank 8 \
      --warmup "$WARMUP" --steps "$STEPS" --out "$OUT/anchor-$n"
  done
fi
W=bench/trainer_bench.py
trun $G1 ours-padded-1 $W run --case padded "${common[@]}" --out "$OUT/ours-padded-1"
# the same without the chunked head+loss (whole fp32 logits, as the anchor): what chunking costs
TUNEDECK_LOSS_CHUNK=100000000 trun $G1 ours-padded-1-nochunk $W run --case padded "${common[@]}" \
  --out "$OUT/ours-padded-1-nochunk"
trun $G2 ours-padded-2 $W run --case padded "${common[@]}" --out "$OUT/ours-padded-2"
trun $G1 ours-chat-padded-1 $W run --case chat "${common[@]}" --out "$OUT/ours-chat-padded-1"
trun $G1 ours-chat-packed-1 $W run --case packed "${common[@]}" --out "$OUT/ours-chat-packed-1"
trun $G2 ours-fsdp2-full-2 $W run --case fsdp2 "${common[@]}" --out "$OUT/ours-fsdp2-full-2"
"$PY" $W table "$OUT" --warmup "$WARMUP" | tee "$OUT/table.txt"
