# Sourced by the device scripts (bench/h200_*.sh): installs what the carried .gpu/ holds (see
# bench/gpu_wheels.sh) into /tmp/site, bitsandbytes with the dist-info transformers asks for,
# and Unsloth, when .gpu/unsloth/ is there, into /tmp/usite (UNSLOTH_PATH: only its case sees it,
# since it patches transformers at import). Exports PYTHONPATH, and what every device script
# runs under: multicast off (NVLS, symmetric memory, NVSHMEM), no network, unbuffered output.
# case_losses prints the trainer-bench cases' step losses side by side; clocks_on/clocks_off
# sample the GPU's clock and power around a part (bench/gpu_clocks.py).
gpu_site() {
  export PYTHONUNBUFFERED=1 PYTHON=python3
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 MODELSCOPE_OFFLINE=1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .gpu/*.whl || return 1
  if [[ -d .gpu/bitsandbytes_pkg ]]; then   # transformers asks importlib.metadata for its version
    rm -rf /tmp/site/bitsandbytes && cp -r .gpu/bitsandbytes_pkg /tmp/site/bitsandbytes
    mkdir -p /tmp/site/bitsandbytes-0.50.2.dist-info
    printf 'Metadata-Version: 2.1\nName: bitsandbytes\nVersion: 0.50.2\n' \
      > /tmp/site/bitsandbytes-0.50.2.dist-info/METADATA
  fi
  if [[ -d .gpu/unsloth ]]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/usite .gpu/unsloth/*.whl && cp -r .gpu/unsloth/site/. /tmp/usite/ \
      && export UNSLOTH_PATH=/tmp/usite
  fi
  export PYTHONPATH=/tmp/site
}

case_losses() {  # case_losses EVENTS...: each trainer-bench case's step losses from its rank0.jsonl
  for f in "$@"; do
    python3 -c 'import json,sys; print(sys.argv[1].split("/")[-3], [round(e["loss"], 4) for e in map(json.loads, open(sys.argv[1])) if e.get("kind") == "step"])' "$f"
  done
}

clocks_on() {  # clocks_on FILE: the GPU's clock, power and temperature sampled until clocks_off
  python3 bench/gpu_clocks.py sample "$1" &
  CLOCKS_PID=$!
}

clocks_off() {  # clocks_off FILE: the sampler stopped, its busy samples' medians printed
  kill "$CLOCKS_PID" 2>/dev/null
  wait "$CLOCKS_PID" 2>/dev/null
  echo "clocks: $(python3 bench/gpu_clocks.py summary "$1")"
}
