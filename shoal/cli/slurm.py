"""`shoal slurm RECIPE --nodes N --gpus-per-node G [--partition P] [--time T] [--submit]`: an sbatch script."""

from __future__ import annotations

from shoal.cli.argtypes import non_empty


def register(sub) -> None:
    p = sub.add_parser("slurm", help="write (and with --submit, sbatch) a Slurm script that runs a recipe")
    p.add_argument("recipe", type=non_empty("recipes/debug.toml"), help="TOML recipe (a path every node can read)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--gpus-per-node", type=int, required=True, help="GPUs per node = processes per node (0: CPU, 1)")
    p.add_argument("--partition", type=non_empty("--partition gpu"))
    p.add_argument("--time", type=non_empty("--time 04:00:00"), help="time limit, e.g. 04:00:00")
    p.add_argument("--name", type=non_empty("--name pretrain"), help="job name (default: from the recipe file name)")
    p.add_argument("--port", type=int, default=29500, help="rendezvous port on the first node")
    p.add_argument("--python", type=non_empty("--python /shared/venv/bin/python"), default="python",
                   help="the Python that has shoal on the nodes")
    p.add_argument("--run-out", type=non_empty("--run-out /shared/runs/pretrain"),
                   help="the run's --out, on a shared filesystem (default runs/NAME, absolute)")
    p.add_argument("--out", type=non_empty("--out slurm"), default="slurm", help="folder for NAME.sbatch")
    p.add_argument("--submit", action="store_true", help="run sbatch on the script")
    p.set_defaults(func=run)


def run(args) -> int:
    import re
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from shoal.files import check_output_dir, check_output_file
    from shoal.config import load_config
    from shoal.errors import UserError
    from shoal.job import resolve
    from shoal.launch.slurm import MARK, check, sbatch_script
    from shoal.parallel.mesh import ParallelDims, placement_warning

    name = args.name or re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(args.recipe).stem) or "shoal"
    args.partition, args.time = args.partition or "", args.time or ""  # left out: Slurm's defaults
    check(name, args.nodes, args.gpus_per_node, args.partition, args.time)
    if not 1 <= args.port <= 65535:
        raise UserError("--port", args.port, "must be in 1..65535")
    per_node = max(args.gpus_per_node, 1)
    job = resolve(load_config(args.recipe, args.overrides), args.nodes * per_node)  # layout mistakes: now
    if line := placement_warning(ParallelDims.of(job.layout), per_node):
        print(line, file=sys.stderr)
    if args.submit and not shutil.which("sbatch"):
        raise UserError("--submit", True, "sbatch is not on PATH here; run on a Slurm login node, or drop --submit "
                                          "and sbatch the script there")
    run_out = args.run_out or str(Path("runs", name).absolute())
    check_output_dir("--run-out", run_out)
    check_output_dir("--out", args.out)
    script = Path(args.out) / f"{name}.sbatch"
    check_output_file("--name", str(script), replaces=MARK)  # a name too long for the disk; a person's own script
    text = sbatch_script(name, args.recipe, run_out, args.nodes, args.gpus_per_node, partition=args.partition,
                         time=args.time, python=args.python, overrides=tuple(args.overrides), port=args.port)
    Path(run_out).mkdir(parents=True, exist_ok=True)  # sbatch opens its --output there before the script runs
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(text)
    print(f"wrote {script}")
    if not args.submit:
        print(f"submit with: sbatch {script}")
        return 0
    return subprocess.run(["sbatch", str(script)]).returncode
