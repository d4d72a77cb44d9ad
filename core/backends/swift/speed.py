"""ms-swift speed switches worth adding to a run, with what each gave when measured (one H200,
Qwen2.5-7B LoRA r=8, batch 4 x 2048; docs/benchmarks.md), offered only where the installed
ms-swift has the flag. The advisor (core/estimate) shows them; this layer knows the flags.
"""

from __future__ import annotations

# ms-swift speed switches, with what they gave on one H200 (Qwen2.5-7B LoRA r=8, batch 4 x 2048,
# bf16, SDPA; docs/benchmarks.md, 2026-12-01): the same loop with Liger kernels 1.16x tokens/s
# and peak memory 79.9 -> 55.8 GiB; with torch.compile per decoder layer 1.08x; variable-length
# chat packed padding-free instead of padded 2.5x labelled tokens/s (built-in trainer).
LIGER_GAIN, COMPILE_GAIN, PACKING_GAIN = 1.16, 1.08, 2.5
FLASH_IMPLS = ("flash_attn", "flash_attention_2", "flash_attention_3", "flash_attention_4")


def speed_flags(
    argv: list[str], command: str = "sft", known: dict | None = None, variable_length: bool = True
) -> list[dict]:
    """ms-swift flags that would make this run faster and that the installed ms-swift has
    (known: its flag table for `command`; default read from the installed ms-swift; none
    installed: no suggestion), each {"flag", "value", "gain", "why"}. A flag the argv already
    sets is left alone. variable_length: the data's samples vary in length (chat data)."""
    if known is None:
        from tunedeck.core.backends.swift.flags import flag_tables

        tables = flag_tables()
        known = (tables or {}).get("commands", {}).get(command) or {}
    from tunedeck.core.backends.swift.flags import split_flags

    given = {f[2:]: (v[-1] if v else "true") for f, v in split_flags(argv) if f}
    on = {k for k, v in given.items() if v.strip().lower() in ("1", "true", "yes", "on")}
    out: list[dict] = []

    def offer(flag: str, value: str, gain: float, why: str) -> None:
        if flag in known and flag not in given:
            out.append({"flag": f"--{flag}", "value": value, "gain": gain, "why": why})

    offer(
        "use_liger_kernel",
        "true",
        LIGER_GAIN,
        f"Liger's fused RoPE, RMSNorm, SwiGLU and linear cross-entropy: ~{LIGER_GAIN:.2f}x "
        "tokens/s and ~30 % less peak memory on a 7B LoRA (measured, one H200)",
    )
    offer(
        "torch_compile",
        "true",
        COMPILE_GAIN,
        f"torch.compile: ~{COMPILE_GAIN:.2f}x tokens/s on a 7B LoRA once compiled (measured "
        "per decoder layer; about a minute of compiling first)",
    )
    if variable_length and not {"padding_free", "packing"} & on:
        attn = given.get("attn_impl", "")
        if attn in FLASH_IMPLS:
            offer(
                "padding_free",
                "true",
                PACKING_GAIN,
                f"no padding in variable-length batches: ~{PACKING_GAIN:.1f}x labelled "
                "tokens/s on chat data (measured with packing, one H200)",
            )
        elif "padding_free" in known and "padding_free" not in given:
            out.append(
                {
                    "flag": "--padding_free",
                    "value": "true",
                    "gain": PACKING_GAIN,
                    "why": f"no padding in variable-length batches (~{PACKING_GAIN:.1f}x "
                    "labelled tokens/s on chat data) but ms-swift allows it only "
                    "with --attn_impl flash_attn (flash-attn installed)",
                }
            )
    return out
