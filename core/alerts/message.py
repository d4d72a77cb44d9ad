"""What an alert says: run name, host, what happened, its cause and fix, and the tunedeck
command to look. One dict, sent as JSON to a user command and as title/body to apprise."""

from __future__ import annotations

import os
import time
from typing import Any

from tunedeck.core.text import fmt_duration

END_EVENT = {"succeeded": "finished", "failed": "failed", "stopped": "stopped"}


def finding_key(f: dict[str, Any]) -> str:
    """One alert per finding: its category on its rank and node."""
    return f"finding:{f.get('category')}:{f.get('rank')}:{f.get('node')}"


def finding_event(f: dict[str, Any], wants) -> str | None:
    """The `on` event a finding alerts as, or None when the user did not ask for it."""
    cat = str(f.get("category") or "")
    if wants(cat):
        return cat
    if f.get("severity") == "error" and wants("errors"):
        return "errors"
    return None


def _where(f: dict[str, Any]) -> str:
    bits = []
    if f.get("rank") is not None:
        bits.append(f"rank {f['rank']}")
    if f.get("node") is not None:
        bits.append(f"node {f['node']}")
    return f" ({', '.join(bits)})" if bits else ""


def from_finding(run_id: str, name: str, event: str, f: dict[str, Any]) -> dict[str, Any]:
    return _alert(
        run_id,
        name,
        event,
        finding_key(f),
        title=f"tunedeck {name}: {f.get('summary')}{_where(f)}",
        cause=str(f.get("cause") or ""),
        fix=str(f.get("fix") or ""),
        look=f"tunedeck diagnose {run_id}",
        severity=str(f.get("severity") or "warning"),
    )


def from_end(
    run_id: str, name: str, status: str, message: str, root: dict[str, Any] | None
) -> dict[str, Any]:
    """The run's end; `root` the finding that caused a failure (its cause and fix travel
    with this one alert, which then stands for it)."""
    title = f"tunedeck {name}: {status} ({message})"
    cause = fix = ""
    if root is not None:
        title += f"; {root.get('summary')}{_where(root)}"
        cause, fix = str(root.get("cause") or ""), str(root.get("fix") or "")
    return _alert(
        run_id,
        name,
        END_EVENT.get(status, status),
        "end",
        title=title,
        cause=cause,
        fix=fix,
        look=f"tunedeck {'diagnose' if status == 'failed' else 'status'} {run_id}",
        severity="error" if status == "failed" else "info",
        status=status,
    )


def idle_gpus(run_id: str, name: str, idle_s: float, utils: list[float]) -> dict[str, Any]:
    shown = ", ".join(f"{u:.0f}%" for u in utils)
    return _alert(
        run_id,
        name,
        "idle_gpus",
        "idle_gpus",
        title=f"tunedeck {name}: its GPUs have been idle for {fmt_duration(idle_s)} ({shown})",
        cause="the run is running but no GPU of it computes: a hang before the first step, a "
        "dataloader that never delivers, or a run left waiting on something",
        fix=f"look at its stacks and logs (tunedeck stacks {run_id}); stop it if it is stuck",
        look=f"tunedeck status {run_id}",
        severity="warning",
    )


def eta_reached(run_id: str, name: str, over_s: float, step: int, max_steps: int) -> dict[str, Any]:
    return _alert(
        run_id,
        name,
        "eta_reached",
        "eta_reached",
        title=f"tunedeck {name}: past its ETA by {fmt_duration(over_s)}, at step {step}/{max_steps}",
        cause="the run is slower than its early steps promised: a stall, a straggler, "
        "throttled GPUs or a slower stretch of data",
        fix=f"tunedeck diagnose {run_id} names a stall or straggler if there is one",
        look=f"tunedeck status {run_id}",
        severity="warning",
    )


def _alert(run_id: str, name: str, event: str, key: str, **kw: Any) -> dict[str, Any]:
    return {
        "event": event,
        "key": key,
        "run_id": run_id,
        "run": name,
        "host": os.uname().nodename,
        "t": time.time(),
        **kw,
    }


def body(alert: dict[str, Any]) -> str:
    lines = [f"run {alert['run_id']} on {alert['host']}"]
    if alert.get("cause"):
        lines.append(f"cause: {alert['cause']}")
    if alert.get("fix"):
        lines.append(f"fix: {alert['fix']}")
    if alert.get("suppressed"):
        lines.append(f"({alert['suppressed']} more alerts were held back by the rate limit)")
    lines.append(f"look: {alert['look']}")
    return "\n".join(lines)
