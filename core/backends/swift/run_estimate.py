"""How an ms-swift spec runs, for the numbers (`Backend.as_run` and its kin, asked through
core/backends/run_estimate.py: the one path `tunedeck estimate`, the compose form and the
preflight memory check all take, so the three show one number for one spec).

An ms-swift spec's unset key emits no flag and ms-swift's own default applies, so the numbers
take that default rather than tunedeck's (`keymap.estimate_view`: a micro batch of 1, its LoRA
sizes, gradient checkpointing on, the accumulation that makes a global batch of 16), and an
unset data.max_length is the model's own length limit, where ms-swift truncates without
--max_length. This sits in core/backends/swift, not in
core/estimate, because it is the lowest layer that sees both the estimator and ms-swift's
tables. Other backends' specs pass through unchanged.
"""

from __future__ import annotations

from typing import Any

from tunedeck.core.estimate import ArchError, arch_for_spec
from tunedeck.core.spec import RunSpec, check_option, is_set, set_values
from tunedeck.core.backends.swift.flags import FlagTableError, flag_tables
from tunedeck.core.backends.swift.keymap import (
    default_grad_accum,
    effective_values,
    estimate_view,
    length_phrase,
)


def _tables() -> dict | None:
    try:
        return flag_tables()
    except FlagTableError:  # no table to read defaults from: tunedeck's stand in
        return None


def _model_limit(spec: RunSpec) -> int:
    try:
        return arch_for_spec(spec).max_len
    except ArchError:
        return 0


def run_settings(spec: RunSpec) -> list[dict[str, Any]]:
    """`keymap.effective_values` of `spec` (resolved: the accumulation depends on the ranks),
    with what ms-swift works out at start put in where tunedeck can tell it too: an unset
    --max_length is the model's length limit, an unset accumulation makes a global batch
    of 16. What the dry run, the compose form's pane and its empty boxes show."""
    if spec.backend != "swift":
        return []
    rows = effective_values(spec, _tables())
    micro = spec.train.per_device_batch_size
    for r in rows:
        if r["value"] is None and r["source"].startswith("ms-swift"):
            if r["key"] == "data.max_length" and (limit := _model_limit(spec)):
                r.update(value=limit, source=r["source"] + ": the model's length limit")
            elif r["key"] == "train.grad_accum" and not spec.swift.command.startswith("megatron"):
                r.update(
                    value=default_grad_accum(spec, micro),
                    source=r["source"] + ": a global batch of 16",
                )
        elif r["key"] == "train.per_device_batch_size" and isinstance(r["value"], int):
            micro = r["value"]  # comes before train.grad_accum in the table
    return rows


def run_defaults(spec: RunSpec) -> dict[str, tuple[Any, str]]:
    """For each ms-swift setting `spec` leaves unset: (the value ms-swift runs with, None
    where it decides at run time; where that comes from). Empty for other backends."""
    return {
        r["key"]: (r["value"], r["source"])
        for r in run_settings(spec)
        if r["source"].startswith("ms-swift")
    }


def length_is_bound(spec: RunSpec) -> bool:
    """Whether the figures of `spec`'s run are sized at ms-swift's length limit rather than a
    length the user chose (the data decides how long batches really get)."""
    return spec.backend == "swift" and not is_set(spec, "data.max_length")


def length_unless_steps(spec: RunSpec) -> str | None:
    """How long an ms-swift run trains when the spec does not say it in steps ("3 epochs
    (ms-swift X default)"): a step count and its ETA would be tunedeck's default, not the
    run's. None when the steps are the spec's."""
    if spec.backend != "swift" or is_set(spec, "train.max_steps"):
        return None
    return length_phrase(spec, _tables())


def as_run(spec: RunSpec) -> tuple[RunSpec, list[str]]:
    """`spec` as its backend will run it, for the numbers only (never for a plan), and what
    the figures had to assume."""
    if spec.backend != "swift":
        return spec, []
    view = estimate_view(spec, _tables())
    if not length_is_bound(spec):
        return view, []
    # what run_settings puts in for an unset --max_length, without its second pass over
    # the flag tables
    limit = _model_limit(spec)
    if limit and check_option("data.max_length", limit)[1] is None:
        view = set_values(view, {"data.max_length": limit})
        view.explicit = set(spec.explicit)
        return view, [
            f"data.max_length unset: ms-swift truncates at {limit} tokens "
            f"(the model's length limit), so the figures assume batches that long; "
            "set it to the data's longest sample for a tighter one"
        ]
    return view, [
        f"data.max_length unset and ms-swift's limit unknown here: the figures "
        f"assume {view.data.max_length} tokens"
    ]


def length_words(spec: RunSpec) -> str:
    """How long the run trains, as ms-swift runs it (its default epochs where unset)."""
    return length_phrase(spec, _tables())
