"""A rank that fails on the first agent attempt and succeeds after (restart-policy tests)."""

import json
import os
import sys
from pathlib import Path

attempt = int(os.environ.get("TUNEDECK_ATTEMPT", "0"))
rank = int(os.environ["RANK"])
events = Path(os.environ["TUNEDECK_RUN_DIR"]) / "events" / f"rank{rank}.jsonl"
with events.open("a") as f:
    f.write(json.dumps({"t": 0.0, "kind": "start", "rank": rank, "attempt": attempt}) + "\n")
if attempt == 0 and rank == 1:
    print("rank 1 fails on purpose", file=sys.stderr)
    sys.exit(3)
