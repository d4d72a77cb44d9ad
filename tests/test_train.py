"""The built-in trainer: data labelling, the demo model cache, and real 2-process torchrun runs
on CPU (gloo) including a graceful SIGTERM stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytest.importorskip("torch", reason="the train extra is not installed")

from tunedeck.core.demo import ensure_tiny_model, load_tokenizer
from tests.conftest import make_run_dir, trainer_torchrun_argv
from tunedeck.core.train.data import IGNORE, DataError, encode, read_conversations
from tunedeck.core.rundir.events import read_events

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "presets" / "data" / "demo_chat.jsonl"


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory):
    """One model cache for the whole session, so the demo model is built once."""
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNEDECK_CACHE", str(cache))
        yield cache


@pytest.fixture(scope="session")
def tiny_model(tiny_cache) -> Path:
    return ensure_tiny_model(DATA)


# -- unit tests ---------------------------------------------------------------------------


def test_tiny_model_is_built_once(tiny_model, tiny_cache):
    t = time.perf_counter()
    again = ensure_tiny_model(DATA)
    assert time.perf_counter() - t < 0.5
    assert again == tiny_model and again.parent == tiny_cache / "models"
    assert (again / "config.json").exists() and (again / "model.safetensors").exists()
    # nothing half-built is left next to it
    assert [p.name for p in again.parent.iterdir() if not p.name.endswith(".lock")] == [again.name]


def test_tiny_tokenizer_round_trips(tiny_model):
    tok = load_tokenizer(tiny_model)
    assert len(tok) == 1024
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    text = "Convert 12 GiB to MiB.\n  tabs\tand ünïcode ✓"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text


def test_labels_cover_only_assistant_turns(tiny_model):
    tok = load_tokenizer(tiny_model)
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "2 + 3 = 5."},
        {"role": "user", "content": "And times 4?"},
        {"role": "assistant", "content": "5 * 4 = 20."},
    ]
    enc = encode(tok, msgs, max_length=512)
    ids, labels = enc["input_ids"], enc["labels"]
    assert len(ids) == len(labels)
    # contiguous labelled runs, decoded, are exactly the replies with their end-of-turn token
    runs, cur = [], []
    for i, lab in zip(ids, labels):
        if lab != IGNORE:
            assert lab == i
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    assert [tok.decode(r) for r in runs] == ["2 + 3 = 5.<|im_end|>", "5 * 4 = 20.<|im_end|>"]
    prompt = tok.decode([i for i, lab in zip(ids, labels) if lab == IGNORE])
    assert "What is 2 + 3?" in prompt and "And times 4?" in prompt and "Be brief." in prompt


def test_truncation(tiny_model):
    tok = load_tokenizer(tiny_model)
    msgs = [{"role": "user", "content": "hi " * 200}, {"role": "assistant", "content": "ok"}]
    enc = encode(tok, msgs, max_length=16)
    assert len(enc["input_ids"]) == 16 and set(enc["labels"]) == {IGNORE}


@pytest.mark.parametrize(
    "line, problem",
    [
        ('{"messages": [', "not valid JSON"),
        ('["a"]', "expected a JSON object"),
        ('{"messages": []}', "non-empty list"),
        ('{"messages": [{"role": "bot", "content": "x"}]}', "messages[0].role"),
        ('{"messages": [{"role": "user", "content": 3}]}', "messages[0].content"),
        ('{"messages": [{"role": "user", "content": "x"}]}', "no assistant message"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, line, problem):
    good = json.dumps(
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    )
    path = tmp_path / "bad.jsonl"
    path.write_text(f"{good}\n\n{line}\n{good}\n")
    with pytest.raises(DataError) as e:
        read_conversations(path)
    assert str(e.value).startswith(f"{path}:3: ") and problem in str(e.value)


def test_demo_data_is_valid():
    convs = read_conversations(DATA)
    assert 200 <= len(convs) <= 300
    assert any(c[0]["role"] == "system" for c in convs)
    assert any(sum(m["role"] == "assistant" for m in c) > 1 for c in convs)


# -- real torchrun ------------------------------------------------------------------------


def _run_dir(tmp_path: Path, **train) -> Path:
    return make_run_dir(tmp_path / "run", **{f"train__{k}": v for k, v in train.items()})


def _torchrun(run: Path, log: Path) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    argv = trainer_torchrun_argv(run)
    with open(log, "wb") as out:
        return subprocess.Popen(
            argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )


def _wait(proc: subprocess.Popen, log: Path, timeout: float = 90) -> int:
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("torchrun timed out:\n" + log.read_text()[-4000:])
    assert rc == 0, log.read_text()[-4000:]
    return rc


def _steps(run: Path, rank: int) -> list[dict]:
    return [e for e in read_events(run / "events" / f"rank{rank}.jsonl") if e["kind"] == "step"]


def _assert_loads_with_peft(ckpt: Path, base: Path) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), ckpt)
    tok = load_tokenizer(ckpt)
    ids = tok("What is 2 + 3?", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=ids).logits).all()


@pytest.mark.slow
def test_torchrun_trains_and_checkpoints(tmp_path, tiny_model):
    steps = 30
    run = _run_dir(tmp_path, max_steps=steps, save_steps=10)
    log = tmp_path / "torchrun.log"
    _wait(_torchrun(run, log), log)

    s0, s1 = _steps(run, 0), _steps(run, 1)
    assert [e["step"] for e in s0] == [e["step"] for e in s1] == list(range(1, steps + 1))
    assert [e["loss"] for e in s0] == [e["loss"] for e in s1]  # all-reduced: one global loss
    for e in s0 + s1:
        assert e["tokens"] > 0 and e["step_s"] > 0 and 0 <= e["data_wait_s"] <= e["step_s"]
        assert e["mem_gib"] > 0 and e["lr"] >= 0 and e["grad_norm"] > 0
    first = sum(e["loss"] for e in s0[:3]) / 3
    last = sum(e["loss"] for e in s0[-3:]) / 3
    assert last < first - 0.5, (first, last)

    ev0 = read_events(run / "events" / "rank0.jsonl")
    start = next(e for e in ev0 if e["kind"] != "phase")  # the data stage's phases come first
    assert start["kind"] == "start" and start["world_size"] == 2 and start["device"] == "cpu"
    assert 0 < start["trainable_params"] < start["total_params"]
    assert [e["step"] for e in ev0 if e["kind"] == "checkpoint"] == [10, 20, 30]
    for r in (0, 1):
        end = read_events(run / "events" / f"rank{r}.jsonl")[-1]
        assert end["kind"] == "end" and end["reason"] == "completed" and end["step"] == steps

    out = run / "output"
    assert sorted(p.name for p in out.iterdir()) == [
        "checkpoint-10",
        "checkpoint-20",
        "checkpoint-30",
    ]
    ckpt = out / "checkpoint-30"
    for f in (
        "adapter_model.safetensors",
        "adapter_config.json",
        "tokenizer.json",
        "optimizer.pt",
        "scheduler.pt",
        "trainer_state.json",
    ):
        assert (ckpt / f).exists(), f
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert state["step"] == steps and state["seed"] == 42
    _assert_loads_with_peft(ckpt, tiny_model)


@pytest.mark.slow
def test_sigterm_stops_every_rank_after_the_same_step(tmp_path, tiny_model):
    run = _run_dir(tmp_path, max_steps=100_000)
    log = tmp_path / "torchrun.log"
    proc = _torchrun(run, log)
    try:
        deadline = time.monotonic() + 60
        ev = run / "events" / "rank0.jsonl"
        while not (ev.exists() and len(_steps(run, 0)) >= 3):
            assert proc.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, "no steps:\n" + log.read_text()[-4000:]
            time.sleep(0.1)
        # Like the agent: SIGTERM to the worker pids themselves, not to a process group.
        workers = [
            c
            for c in psutil.Process(proc.pid).children()
            if "tunedeck.core.train" in " ".join(c.cmdline())
        ]
        assert len(workers) == 2
        for w in workers:
            w.send_signal(signal.SIGTERM)
        _wait(proc, log, timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()

    ends = [read_events(run / "events" / f"rank{r}.jsonl")[-1] for r in (0, 1)]
    assert [e["kind"] for e in ends] == ["end", "end"]
    assert [e["reason"] for e in ends] == ["stopped", "stopped"]
    stopped_at = ends[0]["step"]
    assert ends[1]["step"] == stopped_at >= 3
    assert _steps(run, 0)[-1]["step"] == _steps(run, 1)[-1]["step"] == stopped_at
    ckpt = run / "output" / f"checkpoint-{stopped_at}"
    assert json.loads((ckpt / "trainer_state.json").read_text())["step"] == stopped_at
    assert [p.name for p in (run / "output").iterdir()] == [ckpt.name]
    _assert_loads_with_peft(ckpt, tiny_model)


@pytest.mark.slow
def test_concurrent_builders_share_one_build(tmp_path):
    """Two processes asking for the demo model at once: one builds, both get it whole."""
    code = (
        "import sys; from pathlib import Path; from tunedeck.core.demo import ensure_tiny_model; "
        "print(ensure_tiny_model(sys.argv[1], Path(sys.argv[2])))"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(DATA), str(tmp_path)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0] == outs[1]
    built = Path(outs[0])
    assert (built / "config.json").exists() and (built / "model.safetensors").exists()
    assert [p.name for p in (tmp_path / "models").iterdir() if not p.name.endswith(".lock")] == [
        built.name
    ]


_LEAVE = """
import atexit, sys, threading, time
from pathlib import Path
from tunedeck.core.train.__main__ import leave

out = Path(sys.argv[1])
def late():  # a non-daemon thread still writing when the rank's work is done
    time.sleep(0.5)
    (out / "thread").write_text("done")
threading.Thread(target=late).start()
atexit.register(lambda: (out / "atexit").write_text("ran"))
sys.stdout.write("no newline, so still in the pipe's buffer")
leave(3)
print("not reached")
"""


def test_a_rank_leaves_without_the_teardown_but_loses_nothing(tmp_path):
    """The trainer's entry skips the interpreter's teardown (~1 s a rank exit with torch and
    transformers loaded), yet joins threads, runs atexit's handlers and flushes its output,
    and exits with main's code."""
    done = subprocess.run(
        [sys.executable, "-c", _LEAVE, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 3, done.stderr[-2000:]
    assert done.stdout == "no newline, so still in the pipe's buffer"
    assert (tmp_path / "thread").read_text() == "done"
    assert (tmp_path / "atexit").read_text() == "ran"
