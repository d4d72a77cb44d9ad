"""`tunedeck alerts test [SPEC]`: one test message through every channel a spec's [alerts]
(over the user's $TUNEDECK_HOME/alerts.toml) configures; exit 1 when one failed."""

from __future__ import annotations

from tunedeck.cli.common import EXIT_USAGE, err
from tunedeck.core.api import alert_test, print_json
from tunedeck.core.spec import SpecError, load_spec


def register(sub) -> None:
    s = sub.add_parser("alerts", help="send a test alert through every configured channel")
    s.add_argument("action", choices=("test",))
    s.add_argument("spec", nargs="?", help="spec whose [alerts] to use (default: alerts.toml)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_alerts)


def cmd_alerts(args) -> int:
    try:
        spec = load_spec(args.spec) if args.spec else None
        results = alert_test(spec)
    except SpecError as e:
        err(e)
        return EXIT_USAGE
    if not results:
        err(
            "no alert channel is configured: set [alerts] urls or command in the spec or "
            "in $TUNEDECK_HOME/alerts.toml"
        )
        return 1
    if args.json:
        print_json([{"channel": c, "ok": not why, "error": why} for c, why in results])
    else:
        for channel, why in results:
            print(f"{channel}: {'sent' if not why else 'FAILED: ' + why}")
    return 0 if all(not why for _, why in results) else 1
