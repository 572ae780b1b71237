"""Slurm: an sbatch script that runs a recipe on N nodes, and the guard against independent copies.

The script starts one task per node with srun; each task runs `shoal train --nnodes` (the elastic
agent behind torchrun) with static rendezvous at the allocation's first node and `--node-rank
$SLURM_NODEID`, so rank blocks follow the order of the allocation (`scontrol show hostnames`).
c10d rendezvous would instead order nodes by sorting their addresses or names (`node10` before
`node2`). shoal's launcher rather than torchrun, because torchrun exits 1 whatever its workers
exit with, and the script requeues on the workers' code for "saved on SIGTERM" (75).

Under Slurm, `srun -n2 shoal train` with nothing mapping ranks starts two complete single-process
trainings into the same --out (they corrupt metrics.jsonl and exit 0): `check_srun_copies`
refuses that before any work.
"""

from __future__ import annotations

import os
import re
import shlex

from shoal.errors import UserError
from shoal.worker.exit_codes import PREEMPTED as PREEMPTED_EXIT

PORT = 29500
SIGNAL_LEAD_S = 120  # SIGTERM this long before the time limit: time to finish a step and save
_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")  # minutes, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]
MAX_TIME_S = 365 * 86400  # no site grants a job a year: more is a unit slip (a bare number is minutes)
MARK = "# written by: shoal slurm"
"""How every script begins after its #! line: a later script of the same name replaces only such a file."""


def time_seconds(time: str) -> int:
    """A --time that matches _TIME, in seconds, read as Slurm reads it."""
    days, _, rest = time.rpartition("-")
    parts = [int(x) for x in rest.split(":")]
    if days:  # D-HH, D-HH:MM, D-HH:MM:SS
        h, m, s = (parts + [0, 0])[:3]
    elif len(parts) == 3:  # HH:MM:SS
        h, m, s = parts
    else:  # MM, MM:SS
        h, m, s = 0, parts[0], (parts + [0])[1]
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s


def check(name: str, nodes: int, gpus_per_node: int, partition: str, time: str) -> None:
    if nodes < 1:
        raise UserError("--nodes", nodes, "must be a positive integer")
    if gpus_per_node < 0:
        raise UserError("--gpus-per-node", gpus_per_node, "must be >= 0 (0: CPU nodes, one process per node)")
    if not re.match(r"^[A-Za-z0-9_.-]+$", name):
        raise UserError("--name", name, "use letters, digits, '_', '.' and '-'")
    if partition and not re.match(r"^[A-Za-z0-9_,.-]+$", partition):
        raise UserError("--partition", partition, "a partition name (or a comma-separated list)")
    if time and not _TIME.match(time):
        raise UserError("--time", time, "write minutes, HH:MM:SS or D-HH:MM:SS, e.g. 04:00:00")
    seconds = time_seconds(time) if time else 0  # 0: Slurm's "no limit"
    if 0 < seconds <= SIGNAL_LEAD_S:  # SIGTERM at once: the job saves, requeues and is signalled again, forever
        raise UserError("--time", time, f"is not longer than the {SIGNAL_LEAD_S} s before the limit at which the job "
                                        "is told to save and requeue; give more, e.g. 04:00:00")
    if seconds > MAX_TIME_S:
        raise UserError("--time", time, "is more than a year (a bare number is minutes); give e.g. 04:00:00 or "
                                        "7-00:00:00")


def _directive_value(field: str, value: str, suffix: str = "") -> str:
    """`value + suffix` as an #SBATCH line carries it. sbatch splits those lines at whitespace and ends them at
    '#' outside quotes, so a --run-out with a space wrote a script sbatch refused ("Invalid directive
    found in batch script"); it takes a value in double or single quotes, but no quote escapes a line break."""
    if not re.search(r"[\s#'\"]", value):
        return value + suffix
    quote = "'" if '"' in value else '"'
    if quote in value or "\n" in value or "\r" in value:
        raise UserError(field, value, "an #SBATCH line cannot carry a path with both kinds of quote or a line "
                                      "break; pick another path")
    return f"{quote}{value}{suffix}{quote}"


def sbatch_script(name: str, recipe: str, run_out: str, nodes: int, gpus_per_node: int, *, partition: str = "",
                  time: str = "", python: str = "python", overrides: tuple[str, ...] = (), port: int = PORT) -> str:
    nproc = max(gpus_per_node, 1)
    head = [f"#SBATCH --job-name={name}", f"#SBATCH --nodes={nodes}", "#SBATCH --ntasks-per-node=1",
            *( [f"#SBATCH --gpus-per-node={gpus_per_node}"] if gpus_per_node else []),
            *( [f"#SBATCH --partition={partition}"] if partition else []),
            *( [f"#SBATCH --time={time}"] if time else []),
            f"#SBATCH --output={_directive_value('--run-out', run_out, '/slurm-%j.out')}",
            "#SBATCH --open-mode=append  # a requeued run adds to the same log",
            "# A job that saved on SIGTERM is requeued (below) and resumes from that checkpoint; SIGTERM comes",
            f"# from scancel --signal=TERM, preemption, and {SIGNAL_LEAD_S} s before the time limit (--signal).",
            "#SBATCH --requeue",
            f"#SBATCH --signal=TERM@{SIGNAL_LEAD_S}"]
    train = " ".join(shlex.quote(a) for a in ["-m", "shoal", "train", recipe, "--out", run_out,
                                              *[f"--set={o}" for o in overrides]])
    return "\n".join([
        "#!/bin/bash",
        f"{MARK} {recipe} --nodes {nodes} --gpus-per-node {gpus_per_node}",
        *head,
        "set -uo pipefail",
        f"mkdir -p {shlex.quote(run_out)}  # on a filesystem every node shares: checkpoints are written by all ranks",
        "",
        "# Node order is the allocation's: node 0 (first in the list) hosts the rendezvous, and",
        "# --node-rank $SLURM_NODEID gives each node the next block of ranks (static rendezvous).",
        'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
        f"PORT={port}",
        "export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}",
        "",
        "# One task per node; each runs shoal's launcher, which starts the node's workers and exits with",
        f"# their code ({PREEMPTED_EXIT}: every rank saved a checkpoint on SIGTERM). $0 and $@ carry the python and",
        "# shoal's arguments past the inner shell without a second round of quoting.",
        "export HEAD PORT",
        "srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c \\",
        f"  'exec \"$0\" \"$@\" --nproc {nproc} --nnodes \"$SLURM_JOB_NUM_NODES\" --node-rank \"$SLURM_NODEID\" "
        "--master \"$HEAD:$PORT\" --rdzv static' \\",
        f"  {shlex.quote(python)} {train} &",
        "SRUN=$!",
        "# SIGTERM sent to this batch shell (scancel --batch, --signal=B:TERM@N) goes on to srun and the tasks",
        'trap \'kill -TERM "$SRUN" 2>/dev/null\' TERM',
        'code=0; wait "$SRUN" || code=$?',
        'while kill -0 "$SRUN" 2>/dev/null; do code=0; wait "$SRUN" || code=$?; done  # a trap ends wait early',
        f'if [ "$code" -eq {PREEMPTED_EXIT} ]; then',
        '  echo "shoal slurm: a checkpoint was saved on SIGTERM; requeueing job $SLURM_JOB_ID to resume from it"',
        '  scontrol requeue "$SLURM_JOB_ID"',
        "fi",
        'exit "$code"',
        "",
    ])


def check_srun_copies(nnodes: int) -> None:
    """Refuse `srun -nK shoal train` (K > 1) where nothing gives the copies ranks: each would train alone."""
    tasks = os.environ.get("SLURM_STEP_NUM_TASKS") or os.environ.get("SLURM_NTASKS")
    if not tasks or "WORLD_SIZE" in os.environ:
        return
    try:
        n = int(tasks)
    except ValueError:
        return
    if n > 1 and nnodes != n:
        raise UserError("SLURM_NTASKS", n, f"srun started {n} copies of shoal train and nothing gives them ranks: "
                                           f"each would train alone into the same --out. Run one task per node "
                                           f"with torchrun (`shoal slurm` writes that script), or pass --nnodes {n} "
                                           f"--node-rank $SLURM_NODEID --master HEAD")
