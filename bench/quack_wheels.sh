#!/usr/bin/env bash
# quack-kernels 0.6.5 (Tri Dao's CuTe-DSL GEMMs, bench/quack_gemm.py) for the GPU machine, which
# has no network, with the nvidia-cutlass-dsl and apache-tvm-ffi of its time (4.7.1, 0.1.13.post3):
# on an H100 (2026-12-08) cutlass-dsl 4.8.1 broke quack's epilogue objects (a ContextVar its
# semantic key cannot hash) and, beside tvm-ffi 0.1.9, every compile (its make_kwargs_wrapper
# takes no map_dataclass_to_tuple; 0.1.12's does). This set has not run yet (the retries got no
# machine). The compiler, nvidia-cutlass-dsl-libs-cu13, is an 88 MB
# wheel (a 181 MB _cutlass_ir .so and a 43 MB libcute_dsl_runtime.so, each xz'd): with the
# repository that is over the 64 MiB one device call carries, so it travels in two calls to the
# same warm machine (given back after 30 s idle: make the second call at once).
#   bash bench/quack_wheels.sh pack     # here: .quack1/ (the compiler .so, xz), .quack2/ (the rest)
#   call 1, carry [".quack1"]:  bash bench/quack_wheels.sh stage1   # leaves /tmp/quack-ir.so there
#   call 2, carry [".quack2"]:  source bench/quack_wheels.sh && quack_site || exit 1
# quack_site installs into /tmp/site and exports PYTHONPATH (with cutlass's dsl_packages, which
# the base wheel's .pth adds and pip --target does not run) and the device scripts' environment;
# it fails at once when /tmp/quack-ir.so is missing (call 2 got a fresh machine: redo call 1).
# .git/info/exclude must ignore /.quack1/ and /.quack2/. DL: where the wheels are downloaded.
CUTE=4.7.1
IR=nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.cpython-312-x86_64-linux-gnu.so
RT=nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so

pack() {
  set -euo pipefail
  cd "$(dirname "${BASH_SOURCE[0]}")/.."
  local dl=${DL:-/tmp/quackdl} v
  local plat=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp)
  for v in 28 27 24 17; do plat+=(--platform "manylinux_2_${v}_x86_64"); done
  # einops, cuda-bindings and protobuf are in the device's image
  python3 -m pip download -q "${plat[@]}" -d "$dl" quack-kernels==0.6.5 nvidia-cutlass-dsl==$CUTE \
    nvidia-cutlass-dsl-libs-base==$CUTE nvidia-cutlass-dsl-libs-core==$CUTE \
    nvidia-cutlass-dsl-libs-cu13==$CUTE apache-tvm-ffi==0.1.13.post3 torch-c-dlpack-ext==0.1.5
  rm -rf .quack1 .quack2 "$dl/cu13"
  mkdir -p .quack1 .quack2 "$dl/cu13"
  unzip -q -o "$dl"/nvidia_cutlass_dsl_libs_cu13-$CUTE-*.whl -d "$dl/cu13"
  [[ -s $dl/ir.xz ]] || nice -n 19 xz -9 -T1 -c "$dl/cu13/$IR" > "$dl/ir.xz"
  [[ -s $dl/rt.xz ]] || nice -n 19 xz -9 -T1 -c "$dl/cu13/$RT" > "$dl/rt.xz"
  cp "$dl/ir.xz" .quack1/
  cp "$dl/rt.xz" .quack2/
  tar -C "$dl/cu13" --exclude="$IR" --exclude="$RT" -cf .quack2/cu13.tar .
  for w in quack_kernels-0.6.5 nvidia_cutlass_dsl-$CUTE nvidia_cutlass_dsl_libs_base-$CUTE \
    nvidia_cutlass_dsl_libs_core-$CUTE apache_tvm_ffi-0.1.13.post3 torch_c_dlpack_ext-0.1.5; do
    cp "$dl"/$w-*.whl .quack2/
  done
  du -sh .quack1 .quack2
}

unxz() {  # unxz SRC DST: python's lzma, whether or not the machine has xz
  python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$@"
}

stage1() {  # call 1: the compiler .so out of the repository, where call 2 finds it
  cd "$(dirname "${BASH_SOURCE[0]}")/.."
  unxz .quack1/ir.xz /tmp/quack-ir.so.part && mv /tmp/quack-ir.so.part /tmp/quack-ir.so
  ls -la /tmp/quack-ir.so
}

quack_site() {  # call 2 (again on the same machine: only the exports)
  export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  if [[ ! -s /tmp/site/$IR ]]; then
    [[ -s /tmp/quack-ir.so ]] || { echo "quack_site: no /tmp/quack-ir.so (a fresh machine?)"; return 1; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .quack2/*.whl || return 1
    tar -xf .quack2/cu13.tar -C /tmp/site || return 1
    unxz .quack2/rt.xz "/tmp/site/$RT" && mv /tmp/quack-ir.so "/tmp/site/$IR" || return 1
    chmod +x "/tmp/site/$IR" "/tmp/site/$RT"
  fi
  export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  case ${1:-} in
    pack) pack ;;
    stage1) stage1 ;;
    *) echo "usage: bash bench/quack_wheels.sh pack|stage1 (call 2: source it, quack_site)"; exit 2 ;;
  esac
fi
