"""Telemetry storage: tiers, downsampling, retention, and a simulated week of 8 GPUs."""

from __future__ import annotations

import math
import random
import sqlite3
import time

import pytest

from tunedeck.core.store.store import Store
from tunedeck.core.telemetry.store import RAW_KEEP_S, TelemetryStore


def _series(run_dir, kind, *args, **kw):
    with Store(run_dir) as store:
        return store.telemetry_series(kind, *args, **kw)


T0 = 1_800_000_000.0  # a round start time (bucket edges fall on whole minutes)


def _gpu(t: float, g: int) -> dict:
    util = 50 + 45 * math.sin(t / 300 + g)
    return {
        "util": round(util),
        "mem_util": round(util / 2),
        "mem_used_mib": 90_000 + g,
        "mem_total_mib": 143_771,
        "power_w": round(300 + util, 1),
        "temp_c": 50 + g,
        "sm_mhz": 1980,
        "mem_mhz": 3201,
        "pcie_rx_kbs": random.randint(0, 5000),
        "pcie_tx_kbs": random.randint(0, 5000),
        "nvlink_rx_kbs": None,
        "nvlink_tx_kbs": None,
    }


def _feed(ts: TelemetryStore, t: float, gpus: int = 8) -> None:
    ts.add("gpu", t, [(g, _gpu(t, g)) for g in range(gpus)])
    ts.add(
        "rank",
        t,
        [
            (
                r,
                {
                    "cpu_pct": 100.0,
                    "rss_mib": 3000.0 + r,
                    "threads": 40,
                    "workers": 4,
                    "workers_cpu_pct": 300.0,
                    "workers_rss_mib": 8000.0,
                },
            )
            for r in range(gpus)
        ],
    )
    ts.add(
        "host",
        t,
        [
            (
                0,
                {
                    "cpu_pct": 35.0,
                    "mem_used_mib": 200_000,
                    "mem_total_mib": 2_000_000,
                    "shm_free_mib": 900_000,
                    "disk_free_mib": 5_000_000,
                },
            )
        ],
    )


def test_buckets_hold_min_mean_max(tmp_path):
    db = sqlite3.connect(tmp_path / "run.db")
    ts = TelemetryStore(db)
    for i in range(125):  # 2 min 5 s at 1 Hz, 1 GPU, util = i % 10
        t = T0 + i
        ts.add("gpu", t, [(0, {"util": i % 10, "power_w": None})])
    ts.flush_buckets()
    db.close()
    s = _series(tmp_path, "gpu", T0, T0 + 125, max_points=1000, metrics=["util", "power_w"])
    assert s["resolution_s"] == 1 and len(s["series"][0]["t"]) == 125
    rows = (
        sqlite3.connect(tmp_path / "run.db")
        .execute("SELECT t, n, util_min, util, util_max, power_w FROM tel_gpu_10 ORDER BY t")
        .fetchall()
    )
    assert rows[0] == (T0, 10, 0, 4.5, 9, None)  # power N/A stays N/A, not 0
    assert len(rows) == 13 and rows[-1][1] == 5  # the partial last bucket is kept
    # a window that asks for fewer points is grouped: each point covers 25 s
    s = _series(tmp_path, "gpu", T0, T0 + 125, max_points=5, metrics=["util"])
    g = s["series"][0]
    assert s["step_s"] >= 25 and len(g["t"]) <= 6
    assert min(g["util_min"]) == 0 and max(g["util_max"]) == 9
    assert all(m == 4.5 for m in g["util"][:-1])  # full groups: mean of 0..9
    assert g["util"][-1] == 2.0  # the last group holds only 0..4


def test_unknown_metric_is_named(tmp_path):
    with pytest.raises(ValueError, match="gpu metric.*bogus"):
        _series(tmp_path, "gpu", 0, 1, metrics=["util", "bogus"])


def test_no_run_db_reads_empty(tmp_path):
    assert _series(tmp_path, "gpu", 0, 10)["series"] == {}


def test_week_of_eight_gpus_stays_small_and_queries_fast(tmp_path):
    """7 days x 8 GPUs at 1 Hz, time-compressed so it runs in seconds: every sample lands in
    the same buckets as at 1 Hz, only fewer samples per bucket. Days 1-6 are fed one sample
    per 60 s (their 10 s buckets are pruned after 24 h anyway), the last day one per 10 s
    (every 10 s bucket a 1 Hz run keeps), and the last hour at full 1 Hz (the raw tier's whole
    retention). So each tier ends with exactly the rows a real week leaves."""
    random.seed(1)
    path = tmp_path / "run.db"
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    ts = TelemetryStore(db)
    week = 7 * 86400
    start = time.monotonic()
    t, n = T0, 0
    for until, step in ((T0 + week - 86400, 60), (T0 + week - RAW_KEEP_S, 10), (T0 + week, 1)):
        while t < until:
            _feed(ts, t)
            t += step
            n += 1
            if n % 2000 == 0:
                ts.commit()
    ts.flush_buckets()
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    feed_s = time.monotonic() - start
    size_mb = path.stat().st_size / 1e6
    rows60 = sqlite3.connect(path).execute("SELECT COUNT(*) FROM tel_gpu_60").fetchone()[0]
    assert rows60 == 8 * week // 60
    # measured ~38 MB (gpu+rank+host, all three tiers); a generous bound against regressions
    assert size_mb < 60, f"{size_mb:.1f} MB for a week of 8 GPUs"

    end = T0 + week
    q = time.monotonic()
    whole = _series(tmp_path, "gpu", T0, end, max_points=500)
    whole_s = time.monotonic() - q
    assert whole["resolution_s"] == 60  # a week reads 60 s buckets
    assert len(whole["series"]) == 8
    assert all(len(s["t"]) <= 501 for s in whole["series"].values())
    recent = _series(tmp_path, "gpu", end - 300, end, max_points=500)
    assert recent["resolution_s"] == 1 and len(recent["series"][3]["t"]) == 300
    day = _series(tmp_path, "gpu", end - 6 * 3600, end, max_points=2000)
    assert day["resolution_s"] == 10
    old = _series(tmp_path, "gpu", T0 + 86400, T0 + 86400 + 3600, max_points=500)
    assert old["resolution_s"] == 60 and len(old["series"][0]["t"]) in (60, 61)
    assert _series(tmp_path, "rank", end - 60, end, keys=[2])["series"].keys() == {2}
    assert _series(tmp_path, "host", T0, end)["series"][0]["cpu_pct"][0] == 35.0
    # loose: the machine is shared with other test runs
    assert whole_s < 5, f"week query took {whole_s:.2f}s"
    print(
        f"\nweek sim: {n} samples in {feed_s:.1f}s, {size_mb:.1f} MB, "
        f"week query {whole_s * 1000:.0f} ms"
    )
