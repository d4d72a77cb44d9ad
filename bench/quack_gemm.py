"""quack-kernels' Hopper GEMMs (CuTe DSL: TMA and wgmma, warp-specialized, each tile's epilogue
overlapped with the next tile's main loop) against cuBLAS and tunedeck's Triton kernel at the 7B
preset's shapes, timed short and sustained at the power limit (issue 32).

Per GEMM of one Qwen2.5-7B layer at 8,192 tokens, bf16, each projection's forward x·Wᵀ (`.x`)
and input gradient dy·W (`.dx`):
- `cublas`: torch.mm;
- `triton`: core/train/lora_triton.py's persistent TMA kernel with the adapter off, autotuned
  as the trainer runs it;
- `quack`: quack.gemm_interface.gemm, autotuned among QUACK_TILES (each with clusters 2×1, 1×2);
- `triton_lora`, `quack_kcat` (short timing only): with the rank-r adapter, the Triton kernel's
  K step s·u·Bᵀ, and quack's GEMM over [x | u]·[Wᵀ; s·Bᵀ] (K + r, operands stacked beforehand).
The gated MLP's fused epilogues: `gated`, quack's gemm_gated(x, [W_g; W_u]ᵀ, "swiglu"), the
pre-activation (g, u) and h = silu(g)·u out of one GEMM, against `gated_ref`, quack's GEMM then
a compiled SwiGLU; `dgated`, gemm_dgated(dy, W_down, preact, "swiglu"), dg, du and h out of
down's input-gradient GEMM, against `dgated_ref`, quack's GEMM then a compiled dSwiGLU. Each
output's relative error against fp32 torch is recorded.

Timings: `ms`, the median of CUDA events after warm-up (lora_gemm.cuda_ms), and sustained: the
kernel back-to-back in CUDA graphs for --sustain s, its TFLOP/s past the first WARM s with the
median SM clock and power NVML saw meanwhile (bench/gpu_clocks.py sampling into --clocks). A
training step runs at the power limit (docs/benchmarks.md), so the sustained rate is the one that
counts. TFLOP/s count the base GEMM's 2·M·K·N for every way of a shape. quack travels as wheels
(bench/quack_wheels.sh).

    python3 bench/quack_gemm.py [--json OUT] [--clocks FILE] [--sustain 8] [--iters 20]
        [--sustain-shapes gate_up.x,...] [--ways cublas,...] [--budget S]
        [bench/layer_shape.py's flags]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gpu_clocks import read, summary  # noqa: E402  (puts tunedeck on the path too)
from layer_shape import add_shape_args  # noqa: E402
from lora_gemm import cuda_ms  # noqa: E402

# (tile_m, tile_n, pingpong) quack's sm90 autotuner may pick (its full space is 44 configs)
QUACK_TILES = (
    (128, 128, True),
    (128, 192, True),
    (256, 128, False),
    (256, 192, False),
    (128, 256, False),
)
SUSTAINED = ("cublas", "triton", "quack")
MLP = ("gated", "gated_ref", "dgated", "dgated_ref")
WARM = 2.0  # s at the start of a sustained run left out: the clock settling under the load
START = time.time()


def gemms(a) -> list[tuple[str, int, int, int]]:
    """(name, M, K, N) of each GEMM: a projection's forward (.x) and input gradient (.dx)."""
    m, d = a.batch * a.seq, a.hidden // a.heads
    out = []
    for name, k, n in (
        ("gate_up", a.hidden, a.ffn),
        ("down", a.ffn, a.hidden),
        ("q_o", a.hidden, a.heads * d),
        ("k_v", a.hidden, a.kv * d),
    ):
        out += [(f"{name}.x", m, k, n), (f"{name}.dx", m, n, k)]
    return out


def load_quack():
    """quack.gemm_interface with the sm90 autotuners narrowed to QUACK_TILES, no swap_ab."""
    import quack.gemm_interface as qi
    import quack.gemm_runtime.autotune as qa

    def keep(c) -> bool:
        return c.device_capacity != 9 or (
            not c.swap_ab and (c.tile_m, c.tile_n, c.pingpong) in QUACK_TILES
        )

    qi.gemm_tuned.configs = [c for c in qi.gemm_tuned.configs if keep(c.kwargs["config"])]
    every = qa.get_all_configs
    qa.get_all_configs = lambda *args, **kw: [c for c in every(*args, **kw) if keep(c)]
    return qi


def rel(got, ref) -> float:
    return round(((got.float() - ref).norm() / ref.norm()).item(), 6)


def sustained(fn, ms: float, seconds: float, clocks: Path | None) -> dict:
    """`fn` back-to-back for `seconds` (CUDA graphs of ~50 ms, eager where capture fails): the
    ms a call past the first WARM s, and that window's NVML medians."""
    import torch

    reps = max(1, round(50 / ms))
    graph, out = None, {"reps": reps}
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
        run = graph.replay
    except Exception as e:  # a launch capture cannot hold
        out["graph"] = f"{type(e).__name__}: {str(e)[:160]}"
        torch.cuda.synchronize()

        def run():
            for _ in range(reps):
                fn()

    run()
    torch.cuda.synchronize()
    marks, first = [torch.cuda.Event(enable_timing=True)], 0
    marks[0].record()
    t0 = time.time()
    while time.time() - t0 < seconds:
        run()
        marks.append(torch.cuda.Event(enable_timing=True))
        marks[-1].record()
        if not first and time.time() - t0 >= WARM:
            first = len(marks) - 1
        if len(marks) > 4:
            marks[-4].synchronize()  # the CPU at most 3 replays ahead
    torch.cuda.synchronize()
    t1 = time.time()
    first = first if first < len(marks) - 1 else 0
    out["ms"] = marks[first].elapsed_time(marks[-1]) / ((len(marks) - 1 - first) * reps)
    if clocks is not None:
        rows = [r for r in read(clocks) if t0 + WARM <= r.get("t", 0) <= t1]
        s = summary(rows)
        out.update(mhz=s.get("median_mhz"), watts=s.get("median_w"), samples=s.get("busy"))
    del graph
    torch.cuda.empty_cache()
    return out


def way(row: dict, name: str, fn, flops: float, iters: int, check=None) -> float | None:
    """Time `fn` into row[name] (the first call's s, ms, TFLOP/s and check(output)'s error);
    its ms, None if it failed."""
    import torch

    try:
        t = time.time()
        got = fn()
        torch.cuda.synchronize()
        rec = {"first_s": round(time.time() - t, 2)}
        if check is not None:
            rec["err"] = check(got)
        del got
        rec["ms"] = cuda_ms(fn, iters)
        rec["tflops"] = round(flops / rec["ms"] / 1e9, 1)
    except Exception as e:
        traceback.print_exc()
        row[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        return None
    row[name] = rec
    return rec["ms"]


def sustain(row: dict, fns: dict, flops: float, a) -> None:
    for name, fn in fns.items():
        if "ms" not in row.get(name, {}):
            continue
        if time.time() - START > a.budget:
            row[name]["sustained"] = "skipped: over --budget"
            continue
        try:
            s = sustained(fn, row[name]["ms"], a.sustain, a.clocks)
            s["tflops"] = round(flops / s["ms"] / 1e9, 1)
            row[name]["sustained"] = s
        except Exception as e:
            traceback.print_exc()
            row[name]["sustained"] = f"{type(e).__name__}: {str(e)[:200]}"


def shape_row(qi, lt, name, m, k, n, a) -> tuple[dict, list]:
    """Every way of one GEMM (the module docstring), and its sustained runs to make."""
    import torch

    def rand(*shape, scale=1.0):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * scale

    dx, r, s = name.endswith(".dx"), a.rank, 2.0
    x, u, q = rand(m, k), rand(m, r), rand(r, n, scale=0.02)
    w = rand(k, n, scale=0.02) if dx else rand(n, k, scale=0.02)  # as the layer stores it
    b = w if dx else w.t()  # (K, N)
    x2 = torch.cat([x, u], 1)
    b2 = torch.cat([w, s * q], 0) if dx else torch.cat([w, (s * q).t()], 1).t()
    y = x.new_empty(m, n)
    ref = x.float() @ b.float()
    ref_lora = ref + s * (u.float() @ q.float())
    fns = {
        "cublas": (lambda: torch.mm(x, b, out=y), ref),
        "triton": (lambda: lt.lora_mm_persistent(x, b, None, None, 1.0)[0], ref),
        "quack": (lambda: qi.gemm(x, b, out=y), ref),
        "triton_lora": (lambda: lt.lora_mm_persistent(x, b, u, q, s)[0], ref_lora),
        "quack_kcat": (lambda: qi.gemm(x2, b2, out=y), ref_lora),
    }
    row: dict = {"m": m, "k": k, "n": n}
    flops = 2 * m * k * n
    for way_name, (fn, want) in fns.items():
        if way_name not in a.ways.split(",") or (qi is None and way_name.startswith("quack")):
            continue
        way(row, way_name, fn, flops, a.iters, lambda got, want=want: rel(got, want))
    if qi is not None:
        row["quack_config"] = str(getattr(qi.gemm_tuned, "best_config", None))
    runs = {w_: fns[w_][0] for w_ in SUSTAINED}
    del ref, ref_lora, fns
    return row, [(runs, flops)] if name in a.sustain_shapes.split(",") else []


def mlp_row(qi, a) -> tuple[dict, list]:
    """gate/up's GEMM with SwiGLU in its epilogue and down's input gradient with dSwiGLU in
    its, each against quack's plain GEMM and a compiled elementwise kernel; and the sustained
    runs to make."""
    import torch
    import torch.nn.functional as F

    def rand(*shape, scale=1.0):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * scale

    def dswiglu(dh, g, u):
        g, u, dh = g.float(), u.float(), dh.float()
        sg = torch.sigmoid(g)
        dg, du = dh * u * sg * (1 + g * (1 - sg)), dh * g * sg
        return dg.bfloat16(), du.bfloat16(), (g * sg * u).bfloat16()

    swiglu_c = torch.compile(lambda g, u: F.silu(g) * u)
    dswiglu_c = torch.compile(dswiglu)
    m, h, f = a.batch * a.seq, a.hidden, a.ffn
    x, dy = rand(m, h), rand(m, h)
    wgu, wd = rand(2 * f, h, scale=0.02), rand(h, f, scale=0.02)  # [W_g; W_u], W_down
    p, dh = x.new_empty(m, 2 * f), x.new_empty(m, f)
    g32, u32 = x.float() @ wgu[:f].float().t(), x.float() @ wgu[f:].float().t()
    row: dict = {"m": m, "k": h, "n": f}

    def gated():
        return qi.gemm_gated(x, wgu.t(), activation="swiglu", concat_layout=("B",))

    def gated_ref():
        qi.gemm(x, wgu.t(), out=p)
        return swiglu_c(p[:, :f], p[:, f:])

    t = time.time()
    preact, h_q = gated()
    torch.cuda.synchronize()
    row["gated_first_s"] = round(time.time() - t, 2)  # compiling and tuning
    # which layout the pre-activation comes in: pairs (g0, u0, g1, ...) or [g | u]
    pairs = rel(preact[:, 0::2], g32) < rel(preact[:, :f], g32)
    row["preact_layout"] = "interleaved" if pairs else "concatenated"
    row["err_preact"] = rel(preact[:, 0::2] if pairs else preact[:, :f], g32)
    h32 = F.silu(g32) * u32
    del g32, u32
    flops = 4 * m * h * f
    way(row, "gated", gated, flops, a.iters, lambda got, h32=h32: rel(got[1], h32))
    way(row, "gated_ref", gated_ref, flops, a.iters, lambda got, h32=h32: rel(got, h32))
    del h32
    g, u = (preact[:, 0::2], preact[:, 1::2]) if pairs else (preact[:, :f], preact[:, f:])
    gf, uf = g.float(), u.float()
    dh32 = dy.float() @ wd.float()
    sg = torch.sigmoid(gf)
    dg32, du32, hh32 = dh32 * uf * sg * (1 + gf * (1 - sg)), dh32 * gf * sg, gf * sg * uf
    del dh32, sg, gf, uf

    def dgated():
        return qi.gemm_dgated(dy, wd, preact, activation="swiglu")

    def dgated_ref():
        qi.gemm(dy, wd, out=dh)
        return dswiglu_c(dh, p[:, :f], p[:, f:])

    def check_fused(got, dg32=dg32, du32=du32, hh32=hh32):
        d, hh = got[0], got[1]
        dg, du = (d[:, 0::2], d[:, 1::2]) if pairs else (d[:, :f], d[:, f:])
        return [rel(dg, dg32), rel(du, du32), rel(hh, hh32)]

    p[:, :f].copy_(g)  # the reference's pre-activation [g | u]: the fused backward's values
    p[:, f:].copy_(u)

    def check_ref(got, dg32=dg32, du32=du32, hh32=hh32):
        return [rel(got[0], dg32), rel(got[1], du32), rel(got[2], hh32)]

    flops = 2 * m * h * f
    way(row, "dgated", dgated, flops, a.iters, check_fused)
    way(row, "dgated_ref", dgated_ref, flops, a.iters, check_ref)
    del dg32, du32, hh32
    from quack.gemm_runtime.autotune import _MOD_TUNERS

    row["quack_configs"] = [str(getattr(t, "best_config", None)) for t in _MOD_TUNERS.values()]
    fwd, bwd = (
        {"gated": gated, "gated_ref": gated_ref},
        {"dgated": dgated, "dgated_ref": dgated_ref},
    )
    return row, [(fwd, 4 * m * h * f), (bwd, flops)]


def cell(rec) -> str:
    if not isinstance(rec, dict) or "ms" not in rec:
        return f"{'-':>30}"
    s = rec.get("sustained")
    tail = (
        f"{s['tflops']:6.1f} {s.get('mhz') or 0:5.0f} {s.get('watts') or 0:4.0f}"
        if isinstance(s, dict)
        else f"{'':16}"
    )
    return f"{rec['tflops']:6.1f} {tail}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_shape_args(ap, hidden=3584, ffn=18944, heads=28, kv=4, rank=16, batch=1, seq=8192)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--ways", default="cublas,triton,quack,triton_lora,quack_kcat")
    ap.add_argument("--sustain", type=float, default=8.0, help="s a sustained run")
    ap.add_argument("--sustain-shapes", default="gate_up.x,gate_up.dx,down.x,down.dx,q_o.x,q_o.dx")
    ap.add_argument("--budget", type=float, default=480.0, help="s, then no more sustained runs")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--clocks", type=Path, help="NVML samples (JSON lines); default beside --json")
    a = ap.parse_args()
    import torch
    import triton

    from tunedeck.core.train import lora_triton as lt

    print(torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())
    out: dict = {"args": {k: str(v) for k, v in vars(a).items()}, "gemms": {}}
    try:
        qi = load_quack()
        import quack

        out["quack"] = quack.__version__
    except Exception as e:
        traceback.print_exc()
        out["quack_error"] = f"{type(e).__name__}: {e}"
        qi = None
    if a.clocks is None and a.json is not None:
        a.clocks = a.json.with_name(a.json.stem + "-clocks.jsonl")
    sampler = None
    if a.clocks is not None:
        a.clocks.unlink(missing_ok=True)
        sampler = subprocess.Popen(
            [sys.executable, str(HERE / "gpu_clocks.py"), "sample", str(a.clocks), "--every", "0.1"]
        )

    def save():
        if a.json:
            a.json.write_text(json.dumps(out, indent=1))

    jobs = []  # (row, {way: fn}, flops) for the sustained runs, all after every short timing
    try:
        try:  # first: the fused epilogues are the question
            out["mlp"], runs = mlp_row(qi, a) if qi is not None else ({}, [])
            jobs += [(out["mlp"], fns, flops) for fns, flops in runs]
        except Exception as e:
            traceback.print_exc()
            out["mlp"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        save()
        print(f"mlp {time.time() - START:5.0f} s " + json.dumps(out["mlp"]), flush=True)
        for name, m, k, n in gemms(a):
            out["gemms"][name], runs = shape_row(qi, lt, name, m, k, n, a)
            jobs += [(out["gemms"][name], fns, flops) for fns, flops in runs]
            save()
            print(f"{name:<11} {time.time() - START:5.0f} s " + json.dumps(out["gemms"][name]))
        torch.cuda.empty_cache()
        # the GPU hot before the first sustained run, as through a training step; then the
        # sustained runs back to back, each shape's ways one after another
        x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        out["preheat_cublas_8192"] = heat = sustained(lambda x=x: x @ x, 1.5, a.sustain, a.clocks)
        heat["tflops"] = round(2 * 8192**3 / heat["ms"] / 1e9, 1)
        del x
        for row, fns, flops in jobs:
            sustain(row, fns, flops, a)
            save()
            print(
                f"{time.time() - START:5.0f} s sustained: "
                + ", ".join(f"{w} {row[w].get('sustained')}" for w in fns if w in row),
                flush=True,
            )
    finally:
        if sampler is not None:
            sampler.terminate()
            sampler.wait()
        save()
    print("\nTFLOP/s: short, then sustained with median SM MHz and W (-: not run)")
    ways = ("cublas", "triton", "quack", "triton_lora", "quack_kcat")
    print(f"{'gemm':<11}" + "".join(f"{w:>30}" for w in ways))
    for name, row in out["gemms"].items():
        print(f"{name:<11}" + "".join(f"{cell(row.get(w)):>30}" for w in ways))
    for w in MLP:
        rec = out.get("mlp", {}).get(w)
        err = rec.get("err", rec.get("error")) if isinstance(rec, dict) else None
        print(f"{w:<11}{cell(rec):>30}  err {err}")
    if "mlp" in out:
        print("preact layout:", out["mlp"].get("preact_layout"))
    for name, row in out["gemms"].items():
        print(
            f"err {name:<11}",
            {w: r.get("err", r.get("error")) for w, r in row.items() if isinstance(r, dict)},
        )


if __name__ == "__main__":
    main()
