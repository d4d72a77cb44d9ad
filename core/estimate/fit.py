"""Whether a memory estimate fits a GPU: the one verdict per GPU that preflight's memory check,
the compose screen's side pane, the dry run and the advisor's margin all use, so they never
disagree about the same spec on the same GPU."""

from __future__ import annotations

from dataclasses import dataclass

MARGIN = 0.90  # use at most 90 % of a GPU: the estimate is ±15 %


@dataclass(frozen=True)
class Fit:
    status: str  # pass | warn | fail
    reason: str  # "fits", "will not fit", why it may not
    share: float  # the estimate as a share of the capacity


def fit(per_gpu_gib: float, capacity_gib: float, bound_length: int | None = None) -> Fit:
    """`per_gpu_gib` (the estimate) against one GPU of `capacity_gib`. `bound_length`: the
    estimate was sized at the longest sample the backend allows (an ms-swift spec that leaves
    data.max_length unset), that many tokens: past capacity is then a warning, since shorter
    data may well fit."""
    share = per_gpu_gib / capacity_gib if capacity_gib > 0 else float("inf")
    if per_gpu_gib > capacity_gib:
        if bound_length is not None:
            return Fit(
                "warn",
                f"will not fit if a batch reaches {bound_length} tokens (data.max_length unset)",
                share,
            )
        return Fit("fail", "will not fit", share)
    if per_gpu_gib > capacity_gib * MARGIN:
        return Fit("warn", f"above {MARGIN:.0%}, the estimate's margin of error could OOM", share)
    return Fit("pass", "fits", share)
