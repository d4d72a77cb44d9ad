"""Effective batch: samples per optimizer step = per-device batch x data-parallel ranks x
gradient accumulation. Megatron ranks that split one model (tp x pp x cp) count once."""

from __future__ import annotations

import copy
from dataclasses import dataclass

from tunedeck.core.spec import RunSpec


def world_size(spec: RunSpec) -> int:
    c = spec.cluster
    return max(c.nproc_per_node, 1) * c.nnodes


def data_parallel_size(spec: RunSpec, world: int | None = None) -> int:
    world = world_size(spec) if world is None else world
    p = spec.parallel
    if p.strategy == "megatron":
        shard = p.tp * p.pp * p.cp
        return max(world // shard, 1)
    return max(world, 1)


def effective_batch(spec: RunSpec, world: int | None = None) -> int:
    return (
        spec.train.per_device_batch_size * data_parallel_size(spec, world) * spec.train.grad_accum
    )


def describe(spec: RunSpec, world: int | None = None) -> str:
    dp = data_parallel_size(spec, world)
    return (
        f"effective batch {effective_batch(spec, world)} = "
        f"{spec.train.per_device_batch_size} per device x {dp} data-parallel "
        f"x {spec.train.grad_accum} accumulation"
    )


@dataclass
class Rescale:
    spec: RunSpec
    old_batch: int
    new_batch: int
    note: str

    @property
    def exact(self) -> bool:
        return self.old_batch == self.new_batch


def rescale_grad_accum(spec: RunSpec, new_world: int) -> Rescale:
    """Same effective batch on a new GPU count, by changing gradient accumulation only (the
    per-device batch is what fits in memory; leave it). When the old batch does not divide,
    the nearest accumulation is taken and the note says so."""
    old = effective_batch(spec)
    per_step = spec.train.per_device_batch_size * data_parallel_size(spec, new_world)
    accum = max(round(old / per_step), 1)
    new = copy.deepcopy(spec)
    new.train.grad_accum = accum
    # keep nproc consistent with the new world for single-node specs
    if spec.cluster.nnodes == 1:
        new.cluster.nproc_per_node = new_world
    got = effective_batch(new, new_world)
    note = (
        f"grad_accum {spec.train.grad_accum} -> {accum} keeps the effective batch at {old}"
        if got == old
        else f"grad_accum {spec.train.grad_accum} -> {accum} gives effective batch {got} "
        f"(was {old}; {old} is not a multiple of {per_step})"
    )
    return Rescale(new, old, got, note)
