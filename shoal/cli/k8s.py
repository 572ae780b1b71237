"""`shoal k8s RECIPE --nodes N --gpus-per-node G --image IMAGE`: write the Kubernetes objects that run it."""

from __future__ import annotations

from shoal.cli.argtypes import non_empty


def register(sub) -> None:
    p = sub.add_parser("k8s", help="write a Kubeflow TrainJob, a JobSet and a PyTorchJob for a recipe")
    p.add_argument("recipe", type=non_empty("recipes/debug.toml"),
                   help="TOML recipe, as a path inside the image (relative to its working directory)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--nodes", type=int, required=True, help="machines (pods, one per machine)")
    p.add_argument("--gpus-per-node", type=int, required=True, help="GPUs per machine = processes per pod")
    p.add_argument("--image", required=True, help="container image with shoal and the recipe")
    p.add_argument("--name", type=non_empty("--name pretrain"), help="object name (default: from the recipe file name)")
    p.add_argument("--queue", type=non_empty("--queue team-a"),
                   help="Kueue LocalQueue: adds the queue-name label and suspend")
    p.add_argument("--run-out", type=non_empty("--run-out /checkpoints/pretrain"),
                   help="--out of the run inside the pods (a shared volume; default /checkpoints/NAME)")
    p.add_argument("--out", type=non_empty("--out k8s"), default="k8s",
                   help="folder for trainjob.yaml, jobset.yaml, pytorchjob.yaml")
    p.set_defaults(func=run)


def run(args) -> int:
    import re
    from pathlib import Path

    from shoal.files import check_output_dir
    from shoal.config import load_config
    from shoal.job import resolve
    from shoal.launch.k8s import KINDS, MARK, check, to_yaml
    from shoal.parallel.mesh import ParallelDims, placement_warning

    name = args.name or re.sub(r"[^a-z0-9-]+", "-", Path(args.recipe).stem.lower()).strip("-")[:40] or "shoal"
    queue = args.queue or ""
    run_out = args.run_out or f"/checkpoints/{name}"
    check(name, args.nodes, args.gpus_per_node, args.image, queue, run_out)
    check_output_dir("--out", args.out, own=tuple((f"{kind}.yaml", MARK) for kind in KINDS))  # earlier objects only
    # the recipe must run on nodes x gpus ranks: every layout mistake now, not in a pod
    job = resolve(load_config(args.recipe, args.overrides), args.nodes * args.gpus_per_node)
    if line := placement_warning(ParallelDims.of(job.layout), args.gpus_per_node):
        import sys

        print(line, file=sys.stderr)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for kind, make in KINDS.items():
        obj = make(name, args.recipe, run_out, args.nodes, args.gpus_per_node,
                   args.image, queue)
        _add_overrides(obj, args.overrides)
        (out_dir / f"{kind}.yaml").write_text(to_yaml(obj) + "\n")
        print(f"wrote {out_dir / f'{kind}.yaml'}  ({obj['apiVersion']} {obj['kind']})")
    return 0


def _add_overrides(obj: dict, overrides: list[str]) -> None:
    """--set values reach the pods as the same --set flags after the recipe."""
    if not overrides:
        return
    extra = [f"--set={o}" for o in overrides]
    trainer = obj["spec"].get("trainer")
    if trainer:
        trainer["args"] += extra
        return
    specs = ([r["template"]["spec"]["template"]["spec"] for r in obj["spec"].get("replicatedJobs", [])]
             + [r["template"]["spec"] for r in obj["spec"].get("pytorchReplicaSpecs", {}).values()])
    for spec in specs:
        for c in spec["containers"]:
            c["command"] += extra
