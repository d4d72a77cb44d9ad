"""What alerts a run sends and where: the spec's [alerts] over the user's own file,
`$TUNEDECK_HOME/alerts.toml` (the same three keys, applied to every run), key by key: a key
the spec leaves empty takes the user's value."""

from __future__ import annotations

import stat
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from tunedeck.core.paths import home
from tunedeck.core.spec import ALERT_EVENTS, RunSpec, SpecError

DEFAULT_ON = ("finished", "failed", "stopped", "errors", "stall", "loss_anomaly")
KEYS = ("on", "urls", "command")


@dataclass
class AlertConfig:
    on: tuple[str, ...] = DEFAULT_ON
    urls: list[str] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    idle_minutes: float = 10.0
    eta_margin: float = 0.25

    def wants(self, event: str) -> bool:
        return event in self.on


def user_file() -> Path:
    return home() / "alerts.toml"


def read_user_file(path: Path | None = None) -> dict[str, list[str]]:
    """The user's alerts.toml ({} when there is none). It holds secrets: refused, naming the
    file, when others may read it; a bad key or value is a SpecError naming file and key."""
    path = path or user_file()
    try:
        st = path.stat()
    except FileNotFoundError:
        return {}
    where = str(path)
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SpecError(
            [f"{where}: holds notification tokens but others may read it; chmod 600 {where}"]
        )
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise SpecError([f"{where}: {e}"]) from None
    table = raw.get("alerts", raw)
    out: dict[str, list[str]] = {}
    problems = []
    for key, value in table.items():
        if key not in KEYS:
            problems.append(f"{where}: unknown key {key!r} (known: {', '.join(KEYS)})")
        elif not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            problems.append(f"{where}: {key} must be a list of strings")
        else:
            out[key] = list(value)
    bad = [e for e in out.get("on", []) if e not in ALERT_EVENTS]
    if bad:
        problems.append(f"{where}: on: unknown event {', '.join(bad)}")
    if problems:
        raise SpecError(problems)
    return out


def config_for(spec: RunSpec, user: dict[str, list[str]] | None = None) -> AlertConfig:
    """`spec` with its real values (secrets.json's, not spec.toml's ****)."""
    user = read_user_file() if user is None else user
    a = spec.alerts
    return AlertConfig(
        on=tuple(a.on or user.get("on") or DEFAULT_ON),
        urls=list(a.urls or user.get("urls") or []),
        command=list(a.command or user.get("command") or []),
        idle_minutes=a.idle_minutes,
        eta_margin=a.eta_margin,
    )
