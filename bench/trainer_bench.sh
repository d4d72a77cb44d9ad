#!/usr/bin/env bash
# Built-in trainer vs the plain-PyTorch anchor (bench/anchor/lora_baseline.py), one go.
#   bench/trainer_bench.sh OUTDIR [--tiny] [WARMUP] [STEPS] [CASES]
# GPU: Qwen2.5-7B architecture, random init, LoRA r=8 all-linear, bf16 autocast, SDPA,
# batch 4 x 2048, no gradient checkpointing; 1 GPU then 2; chat data padded vs packed; FSDP2
# full fine-tuning on 2 GPUs. --tiny: a tiny model on 2 CPU ranks, no anchor (script self-test).
# CASES: comma-separated names to run (default: all), from
#   anchor-1 anchor-liger-1 anchor-compile-1 unsloth-1 anchor-2 ours-default-1 ours-default-1-fp8
#   ours-default-1-bf16 ours-default-1-bf16-nolean ours-default-1-fp8-nolean
#   ours-default-1-bf16-{op,addmm,oop,after,kcat,kcatmlp,triton,tritonloop,tritonwide,tritonwidemlp,rank,rankdy,rankcublas,gemmtma,gemmws,eagerce} ours-default-1-fp8-{op,addmm,triton,eagerce}
#   ours-default-1-bf16-profile ours-default-1-fp8-profile ours-default-1-peft ours-padded-1
#   ours-padded-1-eager ours-padded-1-profile ours-padded-1-cudnn ours-padded-1-bs8
#   ours-padded-1-nochunk ours-padded-1-chunk1k ours-padded-1-budget9 ours-padded-1-budget8
#   ours-padded-1-budget7 ours-padded-1-budget5 ours-padded-2 ours-padded-2-eager ours-chat-padded-1
#   ours-chat-packed-1 ours-chat-padded-1-fp8 ours-chat-packed-1-fp8 ours-fsdp2-full-2
# ours-*: train.compile is on (the default) unless the name says eager, LoRA layers fused
# (core/train/lora_fused.py, the CUDA default) unless it says peft. ours-default-1 takes the
# method and batch settings of presets/builtin-7b-lora-h200.toml (method.fp8_base on); -fp8
# and -bf16 force the frozen products' precision either way. anchor-liger-1 needs
# liger-kernel, unsloth-1 Unsloth (bench/unsloth_bench.py; it builds a 15 GB model folder).
# e.g. bench/trainer_bench.sh OUT 3 10 anchor-1,ours-padded-1,anchor-2,ours-padded-2
set -euo pipefail
OUT=${1:?usage: trainer_bench.sh OUTDIR [--tiny] [WARMUP] [STEPS] [CASES]}
shift
TINY=0
if [[ "${1:-}" == "--tiny" ]]; then TINY=1; shift; fi
WARMUP=${1:-3}
STEPS=${2:-10}
CASES=${3:-all}
ALL="anchor-1 anchor-liger-1 anchor-compile-1 unsloth-1 anchor-2 ours-default-1 ours-default-1-fp8 ours-default-1-bf16 ours-default-1-bf16-nolean ours-default-1-fp8-nolean ours-default-1-bf16-profile
ours-default-1-bf16-op ours-default-1-bf16-addmm ours-default-1-bf16-oop ours-default-1-bf16-after ours-default-1-bf16-kcat ours-default-1-bf16-kcatmlp ours-default-1-bf16-triton ours-default-1-bf16-tritonloop ours-default-1-bf16-tritonwide ours-default-1-bf16-tritonwidemlp ours-default-1-bf16-swiglu ours-default-1-bf16-rank ours-default-1-bf16-rankdy ours-default-1-bf16-rankcublas ours-default-1-bf16-gemmtma ours-default-1-bf16-gemmws ours-default-1-bf16-eagerce ours-default-1-fp8-op ours-default-1-fp8-addmm ours-default-1-fp8-triton ours-default-1-fp8-eagerce
ours-default-1-fp8-profile ours-default-1-peft ours-padded-1
ours-padded-1-eager ours-padded-1-profile ours-padded-1-cudnn ours-padded-1-bs8
ours-padded-1-nochunk ours-padded-1-chunk1k ours-padded-1-budget9 ours-padded-1-budget8
ours-padded-1-budget7 ours-padded-1-budget5 ours-padded-2 ours-padded-2-eager ours-chat-padded-1 ours-chat-packed-1
ours-chat-padded-1-fp8 ours-chat-packed-1-fp8 ours-fsdp2-full-2"
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
  rm -rf "${OUT:?}/$name"   # a warm machine keeps the last call's files: no mixed events
  mkdir -p "$OUT/$name"
  port=$((port + 1))
  echo "== $name ($n ranks)"
  local t0=$SECONDS
  timeout "${CASE_TIMEOUT:-400}" \
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
    anchor-*|unsloth-*) if [[ $TINY == 1 ]]; then echo "== $c skipped (--tiny: CPU)"; return; fi ;;
  esac
  local anchor=("$A" --size 7b --seq 2048 --bs 4 --rank 8 --warmup "$WARMUP" --steps "$STEPS")
  case $c in
    anchor-1|anchor-2) trun "${c#anchor-}" "$c" "${anchor[@]}" --out "$OUT/$c" ;;
    anchor-liger-1) trun 1 "$c" "${anchor[@]}" --liger --out "$OUT/$c" ;;
    anchor-compile-1) trun 1 "$c" "${anchor[@]}" --compile --out "$OUT/$c" ;;
    unsloth-1)
      rm -rf "${OUT:?}/$c"
      mkdir -p "$OUT/$c"
      echo "== $c"
      local t0=$SECONDS model
      model=$("$PY" -c "import sys; sys.path.insert(0, 'bench'); import swift_7b; from pathlib import Path; print(swift_7b.make_model(Path('$OUT')))" 2>"$OUT/$c/build.log" | tail -1)
      PYTHONPATH="${UNSLOTH_PATH:-}${UNSLOTH_PATH:+:}$PYTHONPATH" timeout "${CASE_TIMEOUT:-400}" \
        "$PY" bench/unsloth_bench.py --model "$model" --warmup "$WARMUP" --steps "$STEPS" \
        --out "$OUT/$c" > "$OUT/$c/run.log" 2>&1 \
        || { echo "   FAILED, see $OUT/$c/run.log"; tail -5 "$OUT/$c/run.log"; }
      echo "   $((SECONDS - t0)) s" ;;
    ours-default-1) trun 1 "$c" $W run --case padded --preset presets/builtin-7b-lora-h200.toml \
      "${common[@]}" --out "$OUT/$c" ;;
    ours-default-1-fp8) trun 1 "$c" $W run --case padded --preset presets/builtin-7b-lora-h200.toml \
      --fp8 "${common[@]}" --out "$OUT/$c" ;;
    ours-default-1-bf16) trun 1 "$c" $W run --case padded --preset presets/builtin-7b-lora-h200.toml \
      --no-fp8 "${common[@]}" --out "$OUT/$c" ;;
    # torch's default partition of the compiled layers (SiLU(gate)·up and the normalized inputs
    # saved, not recomputed: fastpath.lean_saves), for comparison
    ours-default-1-bf16-nolean) TUNEDECK_LEAN_SAVES=0 trun 1 "$c" $W run --case padded \
      --preset presets/builtin-7b-lora-h200.toml --no-fp8 "${common[@]}" --out "$OUT/$c" ;;
    ours-default-1-fp8-nolean) TUNEDECK_LEAN_SAVES=0 trun 1 "$c" $W run --case padded \
      --preset presets/builtin-7b-lora-h200.toml --fp8 "${common[@]}" --out "$OUT/$c" ;;
    # how the adapter meets the frozen GEMM (core/train/lora_fused.py): addmm traced (ATen copies
    # C; in fp8 out of place), out of place, opaque in-place ops (the default off Hopper), the adapter
    # as extra K columns (core/train/lora_kcat.py; kcatmlp: the MLPs only), one Triton kernel a
    # linear (core/train/lora_triton.py, Hopper's default; tritonwide: one a group of q/k/v or
    # gate/up; swiglu: the MLP's SwiGLU inside its GEMMs, core/train/swiglu_triton.py; rank: its rank-r products by core/train/lora_rank.py, rankdy: only g and dB (the
    # default), rankcublas: all by cuBLAS; gemmtma / gemmws: the persistent kernel's tiles stored
    # by TMA / and its tile loop warp-specialized, TUNEDECK_LORA_GEMM); the head's loss math
    # eager instead of compiled (core/train/ce_kernel.py)
    ours-default-1-bf16-op|ours-default-1-bf16-addmm|ours-default-1-bf16-oop|ours-default-1-bf16-after|ours-default-1-bf16-kcat|ours-default-1-bf16-kcatmlp|ours-default-1-bf16-triton|ours-default-1-bf16-tritonloop|ours-default-1-bf16-tritonwide|ours-default-1-bf16-tritonwidemlp|ours-default-1-bf16-swiglu|ours-default-1-bf16-rank|ours-default-1-bf16-rankdy|ours-default-1-bf16-rankcublas|ours-default-1-bf16-gemmtma|ours-default-1-bf16-gemmws|ours-default-1-bf16-eagerce|ours-default-1-fp8-op|ours-default-1-fp8-addmm|ours-default-1-fp8-triton|ours-default-1-fp8-eagerce)
      # defaults as the trainer's, or as the caller's environment sets them
      local p=--no-fp8 ep=${TUNEDECK_LORA_EPILOGUE:-} ce=${TUNEDECK_FUSED_CE:-1}
      [[ $c == *fp8* ]] && p=--fp8
      [[ $c == *-op ]] && ep=op; [[ $c == *-addmm ]] && ep=1; [[ $c == *-oop ]] && ep=0; [[ $c == *-after ]] && ep=after; [[ $c == *-kcat ]] && ep=kcat; [[ $c == *-kcatmlp ]] && ep=kcat-mlp; [[ $c == *-triton ]] && ep=triton; [[ $c == *-tritonloop ]] && ep=triton-loop; [[ $c == *-tritonwide ]] && ep=triton-wide; [[ $c == *-tritonwidemlp ]] && ep=triton-wide-mlp; [[ $c == *-swiglu ]] && ep=triton-swiglu
      [[ $c == *-eagerce ]] && ce=0
      local rank=${TUNEDECK_LORA_RANK:-}; [[ $c == *-rank ]] && rank=triton; [[ $c == *-rankdy ]] && rank=dy; [[ $c == *-rankcublas ]] && rank=cublas
      local gemm=${TUNEDECK_LORA_GEMM:-}; [[ $c == *-gemmtma ]] && gemm=tma; [[ $c == *-gemmws ]] && gemm=ws
      TUNEDECK_LORA_EPILOGUE=$ep TUNEDECK_FUSED_CE=$ce TUNEDECK_LORA_RANK=$rank TUNEDECK_LORA_GEMM=$gemm trun 1 "$c" $W run --case padded \
        --preset presets/builtin-7b-lora-h200.toml $p "${common[@]}" --out "$OUT/$c" ;;
    # the preset's step under torch.profiler (the step after the warm-up; profile.txt)
    ours-default-1-bf16-profile|ours-default-1-fp8-profile)
      local p=--no-fp8; [[ $c == *fp8* ]] && p=--fp8
      trun 1 "$c" $W run --case padded --preset presets/builtin-7b-lora-h200.toml $p --profile \
        "${common[@]}" --out "$OUT/$c" ;;
    ours-default-1-peft) TUNEDECK_FUSED_LORA=0 trun 1 "$c" $W run --case padded \
      --preset presets/builtin-7b-lora-h200.toml "${common[@]}" --out "$OUT/$c" ;;
    ours-padded-1) trun 1 "$c" $W run --case padded "${common[@]}" --out "$OUT/$c" ;;
    ours-padded-1-eager) trun 1 "$c" $W run --case padded --eager "${common[@]}" --out "$OUT/$c" ;;
    ours-padded-1-profile) trun 1 "$c" $W run --case padded --profile "${common[@]}" --out "$OUT/$c" ;;
    ours-padded-1-cudnn) TUNEDECK_SDPA=cudnn \
      trun 1 "$c" $W run --case padded "${common[@]}" --out "$OUT/$c" ;;
    ours-padded-1-bs8) trun 1 "$c" $W run --case padded "${common[@]}" --bs 8 --out "$OUT/$c" ;;
    # memory: smaller head chunks; the compiler's activation budget (recompute to save memory)
    ours-padded-1-chunk1k) TUNEDECK_LOSS_CHUNK=1024 \
      trun 1 "$c" $W run --case padded "${common[@]}" --out "$OUT/$c" ;;
    ours-padded-1-budget*) TUNEDECK_LOSS_CHUNK=1024 TUNEDECK_ACT_BUDGET="0.${c#ours-padded-1-budget}" \
      trun 1 "$c" $W run --case padded "${common[@]}" --out "$OUT/$c" ;;
    # one head chunk for the whole micro-batch: what chunking costs or saves
    ours-padded-1-nochunk) TUNEDECK_LOSS_CHUNK=100000000 \
      trun 1 "$c" $W run --case padded "${common[@]}" --out "$OUT/$c" ;;
    ours-padded-2) trun 2 "$c" $W run --case padded "${common[@]}" --out "$OUT/$c" ;;
    ours-padded-2-eager) trun 2 "$c" $W run --case padded --eager "${common[@]}" --out "$OUT/$c" ;;
    ours-chat-padded-1) trun 1 "$c" $W run --case chat "${common[@]}" --out "$OUT/$c" ;;
    ours-chat-packed-1) trun 1 "$c" $W run --case packed "${common[@]}" --out "$OUT/$c" ;;
    ours-chat-padded-1-fp8) trun 1 "$c" $W run --case chat --fp8 "${common[@]}" --out "$OUT/$c" ;;
    ours-chat-packed-1-fp8) trun 1 "$c" $W run --case packed --fp8 "${common[@]}" --out "$OUT/$c" ;;
    ours-fsdp2-full-2) trun 2 "$c" $W run --case fsdp2 "${common[@]}" --out "$OUT/$c" ;;
  esac
}
for c in ${CASES//,/ }; do one "$c"; done
"$PY" $W table "$OUT" --warmup "$WARMUP" | tee "$OUT/table.txt"
