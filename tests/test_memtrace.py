"""TUNEDECK_MEM_TRACE's replay of an allocator trace (the recording itself needs CUDA and is
run on the GPU machine: docs/benchmarks.md)."""

from tunedeck.core.train.memtrace import peak_sites


def _ev(action, addr, size, file="x.py", line=1, name="f"):
    return {
        "action": action,
        "addr": addr,
        "size": size,
        "frames": [
            {"filename": "/usr/lib/python3/threading.py", "line": 9, "name": "run"},
            {"filename": f"/site-packages/{file}", "line": line, "name": name},
        ],
    }


def test_peak_is_the_live_set_at_the_largest_moment():
    trace = [
        _ev("alloc", 1, 100, "transformers/models/qwen2.py", 10, "mlp"),
        _ev("alloc", 2, 300, "peft/tuners/lora.py", 20, "forward"),
        _ev("free_completed", 2, 300),
        _ev("alloc", 3, 250, "transformers/models/qwen2.py", 10, "mlp"),
        _ev("alloc", 4, 60, "torch/nn/functional.py", 30, "linear"),
        _ev("free_completed", 9, 999),  # a block from before the recording
        _ev("free_completed", 3, 250),
        _ev("alloc", 5, 10, "peft/tuners/lora.py", 20, "forward"),
    ]
    best, rows = peak_sites({"device_traces": [trace]})
    assert best == 410  # 100 + 250 + 60, not the 300 block's 400
    assert rows[0] == ("transformers/models/qwen2.py:10 mlp", [350, 2])
    assert rows[1] == ("torch/nn/functional.py:30 linear", [60, 1])
    assert len(rows) == 2  # the freed peft block is not live at the peak
