"""records_from_file / records_from_run: one normalised record per step from any format."""

from __future__ import annotations

import json
import math
from pathlib import Path

from tunedeck.core.ingest.metrics import FileMetrics, records_from_file
from tunedeck.core.views.metrics import records_from_run

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "cpu"


def test_swift_console_with_tqdm_glued_by_cr(tmp_path):
    lines = []
    for i in range(1, 6):
        bar = f"Train: {i * 20:3d}%|██   | {i}/5 [00:0{i}<00:01,  4.00it/s]"
        d = {
            "loss": f"{7 - i / 10:.4g}",
            "grad_norm": "1.5",
            "learning_rate": "9e-05",
            "epoch": f"{i / 10:.4g}",
            "global_step/max_steps": f"{i}/5",
            "train_speed(s/it)": "0.25",
        }
        lines.append(bar + "\r" + str(d) + "\r" + bar)
    lines.append(
        str({"train_runtime": "0.838", "train_loss": "6.905", "global_step/max_steps": "5/5"})
    )
    p = tmp_path / "swift.log"
    p.write_text("\n".join(lines) + "\n")
    recs = records_from_file(p)
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 5]
    assert recs[0]["loss"] == 6.9 and recs[0]["max_steps"] == 5 and recs[0]["step_s"] == 0.25
    assert recs[-1]["epoch"] == 0.5


def test_swift_logging_jsonl_and_iter_per_s(tmp_path):
    p = tmp_path / "logging.jsonl"
    rows = [
        {
            "loss": 6.91,
            "grad_norm": 1.55,
            "learning_rate": 9e-05,
            "epoch": 0.08,
            "global_step/max_steps": "1/2",
            "train_speed(iter/s)": 4.0,
        },
        {
            "loss": 6.89,
            "grad_norm": 1.60,
            "learning_rate": 6e-05,
            "epoch": 0.16,
            "global_step/max_steps": "2/2",
            "train_speed(s/it)": 0.2,
        },
        {"eval_loss": 6.5, "epoch": 0.16, "global_step/max_steps": "2/2"},
        {"train_runtime": 1.0, "train_loss": 6.9, "global_step/max_steps": "2/2"},
    ]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recs = records_from_file(p)
    assert len(recs) == 2
    assert recs[0]["step_s"] == 0.25 and recs[1]["step_s"] == 0.2
    assert recs[1]["eval_loss"] == 6.5 and recs[1]["loss"] == 6.89


def test_hf_trainer_dicts_take_the_step_from_the_bar(tmp_path):
    p = tmp_path / "hf.log"
    p.write_text(
        " 33%|███▎      | 10/30 [00:01<00:02,  9.1it/s]\r"
        "{'loss': '6.893', 'grad_norm': '0.51', 'learning_rate': '4e-05', 'epoch': '0.5'}\n"
        " 67%|██████▋   | 20/30 [00:02<00:01,  9.1it/s]\r"
        "{'loss': '6.7', 'grad_norm': '0.5', 'learning_rate': '2e-05', 'epoch': '1'}\n"
        "{'eval_loss': '6.6', 'eval_runtime': '0.1', 'epoch': '1'}\n"
    )
    recs = records_from_file(p)
    assert [(r["step"], r["max_steps"]) for r in recs] == [(10, 30), (20, 30)]
    assert recs[1]["eval_loss"] == 6.6


def test_events_of_two_ranks_deduplicated_and_restart_wins(tmp_path):
    ev = tmp_path / "events"
    ev.mkdir()
    for rank in (0, 1):
        rows = [{"t": 1.0, "kind": "start", "rank": rank, "max_steps": 3}]
        rows += [
            {
                "t": 1.0 + s,
                "kind": "step",
                "rank": rank,
                "step": s,
                "loss": 5.0 - s,
                "lr": 1e-4,
                "grad_norm": 0.5,
                "tokens_per_s": 100.0 + rank,
                "step_s": 0.1,
            }
            for s in (1, 2)
        ]
        # a restart repeats step 2 with a different loss
        rows += [
            {"t": 9.0, "kind": "start", "rank": rank, "max_steps": 3},
            {"t": 10.0, "kind": "step", "rank": rank, "step": 2, "loss": None, "lr": 1e-4},
            {"t": 11.0, "kind": "step", "rank": rank, "step": 3, "loss": 1.5, "lr": 1e-4},
        ]
        (ev / f"rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recs = records_from_run(tmp_path)
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert all(r["rank"] == 0 and r["max_steps"] == 3 for r in recs)
    assert recs[0]["tokens_per_s"] == 100.0 and recs[0]["learning_rate"] == 1e-4
    assert math.isnan(recs[1]["loss"]) and "grad_norm" not in recs[1]


def test_console_dicts_of_a_real_run_dir():
    recs = records_from_run(FIXTURES / "ok")
    assert [r["step"] for r in recs] == list(range(1, 9))
    assert recs[0]["loss"] == 3.0 and recs[0]["rank"] == 0


def test_incremental_poll_reads_only_appended_lines(tmp_path):
    p = tmp_path / "log.txt"
    p.write_text("{'loss': 1.0, 'global_step/max_steps': '1/3'}\n{'loss': 0.9, 'glo")
    fm = FileMetrics(p)
    assert [r["step"] for r in fm.poll()] == [1]
    with open(p, "a") as f:
        f.write("bal_step/max_steps': '2/3'}\n")
    new = fm.poll()
    assert [(r["step"], r["loss"]) for r in new] == [(2, 0.9)]
    assert fm.poll() == []


def test_framework_consoles_read_whole_files():
    """Megatron's `iteration N/ M | ... lm loss:` and torchtune's `1|N|Loss:` behind torchx's
    `[trainer0|0]:` prefix, read through the same FileMetrics as any log."""
    corpus = Path(__file__).resolve().parent / "corpus" / "metrics"
    meg = records_from_file(corpus / "megatron_lm.log")
    assert [r["step"] for r in meg] == list(range(1, 31))
    assert meg[-1]["max_steps"] == 300 and 0.8 < meg[-1]["step_s"] < 0.9
    tune = records_from_file(corpus / "torchtune_torchx_prefix.log")
    assert tune[-1]["step"] == 30 and isinstance(tune[-1]["loss"], float)
