"""`python -m tunedeck.core.supervisor.slurm_job < SPEC`, the first step of the batch script that
`tunedeck export --format slurm` writes: inside the job, on the allocation's first node, it
writes the run folder as `tunedeck launch` would (spec, plan, launch.sh, state.json naming
this job) and prints its path; the script then starts one agent per node on it. So the script
stands alone: `sbatch` of it needs no `tunedeck launch` before.

Secrets: the exported spec holds **** for them (an export never carries a credential); each
is taken from the job's environment (sbatch passes the submitter's), or the job stops naming
the variable.
"""

from __future__ import annotations

import os
import sys

from tunedeck.core.supervisor.launch import prepare_run
from tunedeck.core.spec import MASK, SpecError, loads_spec


def main() -> int:
    try:
        spec = loads_spec(sys.stdin.read(), source="<the job's spec>")
    except SpecError as e:
        print(f"tunedeck: {e}", file=sys.stderr)
        return 2
    missing = [k for k, v in spec.env.items() if v == MASK and not os.environ.get(k)]
    if missing:
        print(
            f"tunedeck: env.{missing[0]} is a secret left out of the script: export "
            f"{missing[0]} before sbatch (it passes the environment to the job)",
            file=sys.stderr,
        )
        return 2
    spec.env.update({k: os.environ[k] for k, v in spec.env.items() if v == MASK})
    try:
        run_dir = prepare_run(spec)
    except ValueError as e:
        print(f"tunedeck: {e}", file=sys.stderr)
        return 2
    from tunedeck.core.rundir import RunDir

    run = RunDir(run_dir)
    st = run.read_state() or {}
    job = os.environ.get("SLURM_JOB_ID", "")
    st.update(slurm_job=job, message=f"Slurm job {job}, submitted with sbatch")
    run.write_state(st)
    print(run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
