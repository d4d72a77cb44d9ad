"""The dataloader probe for ranks tunedeck did not write (ms-swift, HF Trainer, user scripts).

`core/probe/site/` is put first on the ranks' PYTHONPATH; its sitecustomize.py installs
tunedeck.core.probe.dataloader, which times every next() on a torch DataLoader iterator and appends
per-second totals to RUN_DIR/events/probe_rank<RANK>.jsonl. See core/probe/dataloader.py.
"""

from pathlib import Path

SITE_DIR = Path(__file__).resolve().parent / "site"
