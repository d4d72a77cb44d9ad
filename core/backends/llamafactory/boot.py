"""What each rank of a LLaMA-Factory run executes (torchrun runs this file by path, with the
interpreter named by llamafactory.python). Standalone: it imports nothing from tunedeck, since
that interpreter is LLaMA-Factory's own environment.

    boot.py CONFIG_JSON

CONFIG_JSON is the run's whole LLaMA-Factory configuration (the dict a YAML file would hold),
built by the plan. Two tunedeck keys are taken out before LLaMA-Factory sees it:
`tunedeck_dataset_info`, a dataset_info.json for tunedeck's data.path, written into
`tunedeck_dataset_dir` (every rank writes the same bytes through a rename, so no rank reads a
half-written file). The variable TUNEDECK_RESUME_FROM, set by the agent on a restart, becomes
resume_from_checkpoint; a restart without one (TUNEDECK_ATTEMPT > 0) starts over.
"""

import json
import os
import sys


def prepare(cfg):
    info = cfg.pop("tunedeck_dataset_info", None)
    folder = cfg.pop("tunedeck_dataset_dir", None)
    if info is not None and folder:
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f".dataset_info.json.{os.getpid()}")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(info, f, indent=2)
        os.replace(tmp, os.path.join(folder, "dataset_info.json"))
        cfg["dataset_dir"] = folder
    resume = os.environ.get("TUNEDECK_RESUME_FROM")
    if resume:
        cfg["resume_from_checkpoint"] = resume
    elif os.environ.get("TUNEDECK_ATTEMPT", "0") not in ("", "0"):
        # a restart with no checkpoint to go on from starts over: LLaMA-Factory refuses an
        # output folder the failed attempt left files in (its trainer_log.jsonl) unless told
        cfg.setdefault("overwrite_output_dir", True)
    return cfg


def allow_cpu_index_locations():
    """Resuming a CPU run of several ranks: transformers loads optimizer.pt with
    map_location=args.device, which is cpu:<rank> there, and torch's CPU loader only takes
    "cpu". Storages tagged cpu:<n> load as CPU storages."""
    import torch.serialization

    def restore(obj, location):
        return obj if str(location).startswith("cpu:") else None

    torch.serialization.register_package(99, lambda obj: None, restore)


def main(argv):
    if len(argv) != 2:
        sys.exit("usage: boot.py CONFIG_JSON")
    cfg = prepare(json.loads(argv[1]))
    if cfg.get("use_cpu"):
        allow_cpu_index_locations()
    from llamafactory.train.tuner import run_exp

    run_exp(cfg)


if __name__ == "__main__":
    main(sys.argv)
