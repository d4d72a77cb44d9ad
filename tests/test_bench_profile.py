"""The trainer bench's step profile sorts each kernel's GPU time by kind; docs/benchmarks.md
quotes those sums, so tunedeck's own Triton GEMMs must count as matrix products."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from trainer_bench import kernel_kind  # noqa: E402


def test_own_gemms_count_as_matrix_products_and_inductors_kernels_stay_fused():
    # lora_triton's and lora_rank's kernels, by their names as the profiler lists them
    for name in ("mm_persistent", "lora_mm", "strips", "rows"):
        assert kernel_kind(name) == "matrix products", name
    assert kernel_kind("nvjet_sm90_tst_256x152_64x4_1x2_h_bz_coopA_NNT") == "matrix products"
    # Inductor names a kernel after the ops it fused, ours among them: still its fused kind
    fused = "triton_poi_fused__to_copy_lora_linear_triton_backward_mul_silu_view_0"
    assert kernel_kind(fused) == "inductor fused"
    assert kernel_kind("triton_red_fused_rows_sum_1") == "inductor fused"
    sdpa = "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x128"
    assert kernel_kind(sdpa) == "attention"
    # a word inside another kernel's name is not one of ours
    assert kernel_kind("void at::native::reduce_kernel<128, 4, borrows>") == "other"
