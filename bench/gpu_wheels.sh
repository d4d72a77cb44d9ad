#!/usr/bin/env bash
# What a device call carries in the ignored .gpu/ (the GPU machine has no network; its image has
# torch, transformers, peft 0.21, nvidia-ml-py and psutil): ms-swift 4.6.0 and the packages it
# needs that the image lacks (shared/research/swift-anchor.md), peft 0.20 (ms-swift pins <0.21),
# textual and tomli-w (tunedeck itself), liger-kernel, and bitsandbytes unpacked with its CUDA
# 13.0 library only (the whole wheel, 43 MB, would not fit the 64 MiB a call carries).
#   bash bench/gpu_wheels.sh        # here, once per checkout; then run(carry=[".gpu"]) there
#   bash bench/gpu_wheels.sh --unsloth   # also Unsloth for bench/h200_speed.sh
#   bash bench/gpu_wheels.sh --speed     # Unsloth in, ms-swift's own stack set aside in
#                                        # .gpu-aside/: the speed table's carry fits 64 MiB
#   bash bench/gpu_wheels.sh --all       # the set-aside wheels back into .gpu/
# bench/h200_recipes.sh and bench/h200_fp8.sh install them on the device.
set -euo pipefail
cd "$(dirname "$0")/.."
D=.gpu
mkdir -p "$D"
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp)
for v in 34 31 28 27 24 17 5; do PLAT+=(--platform "manylinux_2_${v}_x86_64"); done
PLAT+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
WANT=(
  # ms-swift 4.6.0 and what the image lacks, at the versions that ran there on 2026-11-30
  addict==2.4.0 annotated_types==0.8.0 attrdict==2.0.1 binpacking==2.0.1 cffi==2.1.1
  cpm_kernels==1.0.11 cryptography==50.0.2 dacite==1.9.2 datasets==4.8.4 defusedxml==0.7.1
  dill==0.4.1 fastapi==0.165.0 fsspec==2026.2.0 httpcore2==2.16.2 httpx2==2.16.2
  importlib_metadata==10.2.0 jiter==0.19.0 json_repair==0.64.6 lazy_importer==0.1.0
  modelscope==1.40.2 modelscope_hub==0.5.1 ms_swift==4.6.0 multiprocess==0.70.19 nltk==3.10.4
  openai==3.57.0 opentelemetry_api==1.45.2 peft==0.20.0 pycparser==3.12 pycryptodome==4.4.0
  pydantic==2.14.4 pydantic_core==2.50.5 rouge==1.0.1 sniffio==1.3.1 starlette==1.10.0
  trl==0.29.1 truststore==0.10.5 typing_extensions==4.16.0 typing_inspection==0.4.5
  tzdata==2026.6 uvicorn==0.54.0 zstandard==0.25.0
  # tunedeck and the speed comparisons
  textual==8.2.8 platformdirs==4.14.9 tomli-w==1.2.0 liger-kernel==0.8.5
  # the Pilot test bench/gpu_smoke.sh runs there
  pytest-asyncio==1.5.0
)
unpack() {  # unpack WHEEL DEST STRIP KEEP...: its files under the KEEP prefixes into DEST,
            # STRIP cut from their names; no RECORD, no CUDA library but 13.0's
  python3 - "$@" <<'EOF'
import sys, zipfile
from pathlib import Path
wheel, dest, strip, *keep = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        base = name.rsplit("/", 1)[-1]
        if not name.startswith(tuple(keep)) or base == "RECORD" or (
                base.startswith("libbitsandbytes_") and base != "libbitsandbytes_cuda130.so"):
            continue
        out = Path(dest) / name.removeprefix(strip)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(z.read(name))
EOF
}

python3 -m pip download -q --no-deps "${PLAT[@]}" -d "$D" "${WANT[@]}"
if [[ ! -d $D/bitsandbytes_pkg ]]; then
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps "${PLAT[@]}" -d "$tmp" bitsandbytes==0.50.2
  unpack "$tmp"/bitsandbytes-*.whl "$D/bitsandbytes_pkg" bitsandbytes/ bitsandbytes/
  rm -rf "$tmp"
fi

# Unsloth 2026.10.9 and what it imports that the image and the wheels above lack; its wheel is
# 28 MB of which 25 MB is a web studio it does not import, so only its package is unpacked
# (.gpu/unsloth/site/). xformers is left out: Unsloth runs without it (SDPA).
if [[ ${1:-} == --unsloth || ${1:-} == --speed ]] && [[ ! -d $D/unsloth/site/unsloth ]]; then
  mkdir -p "$D/unsloth"
  python3 -m pip download -q --no-deps "${PLAT[@]}" -d "$D/unsloth" unsloth_zoo==2026.10.9 \
    tyro==1.0.17 docstring_parser==0.18.0 typeguard==4.6.1 shtab==1.13.0 protobuf==7.36.2 \
    sentencepiece==0.2.3 hf_transfer==0.1.9 cut_cross_entropy==25.1.1 einops==0.8.2 \
    msgspec==0.23.0 structlog==26.1.0 json5==0.17.3 typer==0.29.2 shellingham==1.5.4 \
    nest_asyncio==1.6.0 torchao==0.18.0
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps "${PLAT[@]}" -d "$tmp" unsloth==2026.10.9
  unpack "$tmp"/unsloth-*.whl "$D/unsloth/site" "" unsloth/ unsloth-2026.10.9.dist-info/
  rm -rf "$tmp"
fi
# what only ms-swift imports (26 MB): out of the speed table's carry, back for the recipes'
SWIFT_ONLY=(modelscope ms_swift cryptography pycryptodome openai nltk rouge cpm_kernels
  zstandard modelscope_hub)
if [[ ${1:-} == --speed ]]; then
  mkdir -p .gpu-aside
  for w in "${SWIFT_ONLY[@]}"; do mv "$D/$w"-[0-9]*.whl .gpu-aside/ 2>/dev/null || true; done
elif [[ ${1:-} == --all && -d .gpu-aside ]]; then
  mv .gpu-aside/*.whl "$D/" 2>/dev/null || true
fi
du -sh "$D"
ls "$D"/*.whl | wc -l
