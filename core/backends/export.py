"""`tunedeck export SPEC --format ...`: what a spec runs, in the forms users need elsewhere.

  sh     the launch script of one node (LaunchPlan.to_shell)
  nodes  one command per node, to paste into each node's shell
  slurm  an sbatch script: one srun task per node, MASTER_ADDR from the allocation (launcher
         = "slurm": a job that writes its own run folder, then one agent per node)
  vllm   `vllm serve` for the trained result (LoRA adapter attached); for a run
         (`vllm_for_run`): its merged export, else the base with its last adapter

and each backend's own forms (`Backend.exports`: the command its users type, such as
`swift sft ...` or `llamafactory-cli train x.yaml`), for specs of that backend.

Every form masks secrets (env values and secret-looking flag values).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from tunedeck.core.backends import BACKENDS, backend_of, plan_run
from tunedeck.core.backends.base import Exported
from tunedeck.core.backends.plan import LaunchPlan, _wrap_argv
from tunedeck.core.backends.run_estimate import as_run
from tunedeck.core.estimate import batch
from tunedeck.core.nodes.roster import IFNAME_KEYS
from tunedeck.core.paths import runs_root
from tunedeck.core.rundir import RunDir
from tunedeck.core.rundir.checkpoints import complete_checkpoints
from tunedeck.core.rundir.exports import read_exports
from tunedeck.core.spec import RunSpec, load_spec, mask_argv, mask_env

# a backend's own forms after `sh`, where users look for them
OWN_FORMS = {name: b for b in BACKENDS.values() for name in b.exports}
FORMATS = ("sh", *OWN_FORMS, "nodes", "slurm", "vllm")


class ExportError(ValueError):
    pass


def export_run_dir(spec: RunSpec) -> RunDir:
    """Where an exported run keeps its files on the target machine (logs, output)."""
    return RunDir(runs_root() / f"{spec.name}-export")


def _env_lines(env: dict[str, str]) -> list[str]:
    return [f"export {k}={shlex.quote(v)}" for k, v in mask_env(env).items()]


def export(spec: RunSpec, fmt: str) -> str:
    """The spec resolved for this machine (as a launch would), in the form `fmt`."""
    if fmt not in FORMATS:
        raise ExportError(f"--format {fmt}: one of {', '.join(FORMATS)}")
    owner = OWN_FORMS.get(fmt)
    if owner is not None and owner is not backend_of(spec):
        raise ExportError(
            f'--format {fmt} needs backend = "{owner.name}" (this spec runs {spec.backend})'
        )
    # the script of a script run may exist only on the target machine
    own_output_dir = spec.run.output_dir  # what the user named, before the run's folder
    if fmt == "slurm" and spec.cluster.launcher == "slurm":
        # one tunedeck agent per node; the job plans the spec itself (tunedeck.core.nodes)
        from tunedeck.core.nodes.slurm import job_script

        resolved, _ = plan_run(spec, export_run_dir(spec), local=False)  # refused here
        return job_script(resolved, spec=spec)
    spec, plan = plan_run(spec, export_run_dir(spec), local=False)
    # the batch as the backend runs it (its defaults for unset keys), as the preview says
    summary = f"# {batch.describe(as_run(spec)[0])}\n"
    if fmt == "vllm":
        return vllm_command(spec)
    if owner is not None:
        return own_script(spec, owner.exports[fmt](spec, own_output_dir or None), summary)
    if fmt == "sh":
        return plan.to_shell(spec.cluster.node_rank).replace(
            "set -euo pipefail\n", "set -euo pipefail\n" + summary, 1
        )
    if fmt == "nodes":
        out = [summary.rstrip()]
        for node in plan.nodes:
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in mask_env(node.env).items())
            out.append(
                f"\n# node {node.node_rank} of {plan.nnodes} ({node.host or 'a Slurm node'})"
            )
            out.append(
                f"cd {shlex.quote(node.cwd)} && env {env} \\\n  " + _wrap_argv(mask_argv(node.argv))
            )
        return "\n".join(out) + "\n"
    return slurm_script(spec, plan, summary)


def own_script(spec: RunSpec, form: Exported, summary: str) -> str:
    """A backend's own form as one script: its files written where it runs (quoted
    here-documents, so the shell expands nothing in them), then its command."""
    lines = ["#!/usr/bin/env bash", "set -euo pipefail", summary.rstrip()]
    if spec.cluster.nnodes > 1:
        lines.append("# run on every node with its own NODE_RANK")
    for name, text in form.files.items():
        end = "TUNEDECK_EOF"
        while end in text.splitlines():
            end += "_"
        lines += [f"cat > {shlex.quote(name)} <<'{end}'", text.rstrip("\n"), end]
    lines += _env_lines(form.env)
    lines.append(_wrap_argv(mask_argv(form.argv)))
    return "\n".join(lines) + "\n"


def slurm_script(spec: RunSpec, plan: LaunchPlan, summary: str) -> str:
    """torchrun under srun, one task per node, for a spec whose launcher is not Slurm (no
    tunedeck agent in the job). Node 0's command is every task's, less what is node 0's
    own: its rank, endpoint and log folder come from Slurm's variables per task; its
    `--local_addr` and `is_host=1` are left out (torchrun tells the store's host by the
    endpoint's host name, which Slurm's first host name matches on node 0 only); an
    interface tunedeck chose on this machine is left out too (its name may differ on the
    allocation's nodes): one the spec names (cluster.interface, env) stays."""
    c = spec.cluster
    node = plan.nodes[0]
    argv = list(node.argv)
    # node-specific torchrun flags are filled in per task from Slurm's variables
    drop_next = {
        "--node_rank",
        "--rdzv_endpoint",
        "--master_addr",
        "--master_port",
        "--log_dir",
        "--local_addr",
    }
    rest, skip = [], False
    for a in argv[3:]:  # after `python -m torch.distributed.run`
        if skip:
            skip = False
            continue
        if a in drop_next:
            skip = True
            continue
        if rest and rest[-1] == "--rdzv_conf":
            a = ",".join(kv for kv in a.split(",") if not kv.startswith("is_host="))
        rest.append(a)
    chosen = set() if c.interface else {k for k in IFNAME_KEYS if k not in spec.env}
    log_base = shlex.quote(str(RunDir(node.cwd).logs))
    if c.nnodes > 1:
        inner = (
            'exec "$0" -m torch.distributed.run --node_rank "$SLURM_NODEID" '
            '--rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT" '
            f'--log_dir {log_base}/node"$SLURM_NODEID" "$@"'
        )
    else:
        inner = (
            'exec "$0" -m torch.distributed.run --master_addr "$MASTER_ADDR" '
            f'--master_port "$MASTER_PORT" --log_dir {log_base}/node0 "$@"'
        )
    lines = [
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name={shlex.quote(spec.name)}",
        f"#SBATCH --nodes={c.nnodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --cpus-per-task={max(4 * c.nproc_per_node, 4)}",
    ]
    if c.device != "cpu":
        lines.append(f"#SBATCH --gpus-per-node={c.nproc_per_node}")
    lines += [
        "#SBATCH --output=%x-%j.out",
        "set -euo pipefail",
        summary.rstrip(),
        "# node 0 of the allocation is the rendezvous host",
        'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"export MASTER_PORT={c.master_port or 29500}",
    ]
    lines += _env_lines(
        {
            k: v
            for k, v in node.env.items()
            if k not in ("MASTER_ADDR", "MASTER_PORT") and k not in chosen
        }
    )
    lines.append(f"mkdir -p {shlex.quote(node.cwd)} && cd {shlex.quote(node.cwd)}")
    lines.append(
        "srun --ntasks-per-node=1 bash -c "
        + shlex.quote(inner)
        + " \\\n  "
        + _wrap_argv(mask_argv([argv[0], *rest]))
    )
    return "\n".join(lines) + "\n"


def vllm_command(spec: RunSpec) -> str:
    """`vllm serve` for what the run produces: the base model with the LoRA adapter of the
    last checkpoint attached, or the full checkpoint itself."""
    c = spec.cluster
    out_dir = str(export_run_dir(spec).output_dir(spec))
    # one server on one node: tensor parallel over that node's GPUs (1 on CPU)
    tp = c.nproc_per_node if c.device == "cuda" and c.nproc_per_node > 0 else 1
    model = spec.model.path
    if model.startswith("builtin:"):
        from tunedeck.core.demo import tiny_model_dir

        try:
            model = str(tiny_model_dir(spec.data.path))  # the agent builds it at launch
        except OSError as e:
            said = str(e)
            raise ValueError(
                said if said.startswith("data.path") else f"data.path: {said}"
            ) from None
    step = spec.train.max_steps
    # ms-swift nests checkpoints in a versioned v<N>-<time>/ folder; the others do not
    backend = backend_of(spec)
    ckpt_glob = f"{out_dir}/{backend.checkpoint_glob_prefix}checkpoint-{step}"
    lines = [
        "#!/usr/bin/env bash",
        "set -euo pipefail",
        f"# serve the result of {spec.name!r} with vLLM on one node",
        f"CKPT=$(ls -d {_glob_quote(ckpt_glob)} | tail -n 1)",
    ]
    argv = ["vllm", "serve"]
    if spec.method.type in ("lora", "qlora"):
        argv += [model, "--tensor-parallel-size", str(tp), "--enable-lora"]
        word = f"{_safe_name(spec.name)}=" + "$CKPT"
        tail = ["--lora-modules", word]
        if spec.method.lora_rank > 16:  # vLLM's default max LoRA rank is 16
            tail += ["--max-lora-rank", str(_lora_rank_bucket(spec.method.lora_rank))]
    else:
        argv, tail = ["vllm", "serve"], ["--tensor-parallel-size", str(tp)]
        lines.append(
            'test -f "$CKPT/config.json" || echo "warning: $CKPT holds no HF '
            'config.json (sharded FSDP/DeepSpeed state?); merge or convert it first" >&2'
        )
    _checked(argv[3:] + tail)
    if backend.serve_note:
        lines.append(backend.serve_note)
    parts = [shlex.quote(a) for a in argv]
    if spec.method.type in ("lora", "qlora"):
        parts += ["--lora-modules", f'"{_safe_name(spec.name)}=$CKPT"']
        parts += [shlex.quote(a) for a in tail[2:]]
    else:
        parts += ['"$CKPT"'] + [shlex.quote(a) for a in tail]
    lines.append(_join_pairs(parts))
    return "\n".join(lines) + "\n"


# The `vllm serve` options this export writes, as vLLM declares them (ParallelConfig,
# LoRAConfig, ModelConfig and the OpenAI frontend's args; the same dashed names from vLLM 0.6
# to 0.26): value kind, or the values vLLM accepts. A flag missing here is refused.
VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's MaxLoRARanks
VLLM_SERVE_FLAGS: dict[str, object] = {
    "--tensor-parallel-size": int,
    "--served-model-name": str,
    "--enable-lora": None,  # a switch
    "--lora-modules": "name=path",
    "--max-lora-rank": VLLM_MAX_LORA_RANKS,
}


def _checked(argv: list[str]) -> list[str]:
    """`argv` (after `vllm serve MODEL`) against VLLM_SERVE_FLAGS."""
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag not in VLLM_SERVE_FLAGS:
            raise ExportError(f"vllm serve has no option {flag} in tunedeck's table")
        kind = VLLM_SERVE_FLAGS[flag]
        if kind is None:
            i += 1
            continue
        value = argv[i + 1]
        if isinstance(kind, tuple) and int(value) not in kind:
            raise ExportError(f"vllm serve {flag} takes one of {kind}, not {value}")
        if kind is int:
            int(value)
        if kind == "name=path" and "=" not in value:
            raise ExportError(f"vllm serve {flag} takes NAME=PATH, not {value}")
        i += 2
    return argv


def vllm_for_run(run_dir: Path) -> str:
    """`vllm serve` for what a run trained, with its real paths: the newest merged (or full)
    export that is still on disk (one model, no LoRA), else the base model with the last
    complete checkpoint's adapter (`--enable-lora --lora-modules`), else that checkpoint."""
    run = RunDir(run_dir)
    spec = load_spec(run.spec)
    c = spec.cluster
    tp = c.nproc_per_node if c.device == "cuda" and c.nproc_per_node > 0 else 1
    name = _safe_name(spec.name)
    merged = [r for r in read_exports(run.path) if r.servable]
    if merged:
        best = max(merged, key=lambda r: (r.step, r.t))
        model, what = best.path, f"the {best.kind} export of step {best.step}"
        opts = ["--served-model-name", name, "--tensor-parallel-size", str(tp)]
    else:
        done = complete_checkpoints(run.output_dir(spec))
        if not done:
            raise ExportError(f"run {run.path.name} has no complete checkpoint nor export yet")
        ck = done[-1]
        if (ck.path / "adapter_config.json").is_file():
            model, what = _base_model(spec), f"the base with the adapter of step {ck.step}"
            opts = ["--tensor-parallel-size", str(tp), "--enable-lora"]
            opts += ["--lora-modules", f"{name}={ck.path}"]
            if spec.method.lora_rank > 16:  # vLLM's default max LoRA rank
                opts += ["--max-lora-rank", str(_lora_rank_bucket(spec.method.lora_rank))]
        else:
            model, what = str(ck.path), f"the full checkpoint of step {ck.step}"
            opts = ["--served-model-name", name, "--tensor-parallel-size", str(tp)]
    parts = [shlex.quote(w) for w in ["vllm", "serve", model, *_checked(opts)]]
    return (
        "#!/usr/bin/env bash\nset -euo pipefail\n"
        f"# serve {what} of run {run.path.name} ({spec.name!r}) with vLLM on one node\n"
        + _join_pairs(parts)
        + "\n"
    )


def _base_model(spec: RunSpec) -> str:
    model = spec.model.path
    if model.startswith("builtin:"):
        from tunedeck.core.demo import tiny_model_dir

        return str(tiny_model_dir(spec.data.path))
    return model


def _join_pairs(parts: list[str]) -> str:
    """Already-quoted words, one `--flag value` per line."""
    rows: list[str] = []
    for w in parts:
        if (
            rows
            and not w.startswith("-")
            and (rows[-1].startswith("-") or len(rows) == 1)
            and " " not in rows[-1]
        ):
            rows[-1] += " " + w
        else:
            rows.append(w)
    return " \\\n  ".join(rows)


def _glob_quote(pattern: str) -> str:
    """Quote a path for the shell but leave its `*` wildcards active."""
    return "*".join(shlex.quote(p) if p else "" for p in pattern.split("*"))


def _safe_name(name: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name) or "adapter"


def _lora_rank_bucket(r: int) -> int:
    for b in (8, 16, 32, 64, 128, 256, 320, 512):
        if r <= b:
            return b
    return r
