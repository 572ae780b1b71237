"""The package floors and DESIGN.md's import rules, read from the source (every import, at module level
or inside a function): a package imports only packages on its own floor or below, nothing imports
in a circle, model/ and planner/ never import torch.distributed, the planner imports no torch."""

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

SHOAL = Path(__file__).resolve().parents[2] / "shoal"

FLOORS = [
    ("errors", "files", "config_values", "cache", "comm", "model", "layout", "layout_rules", "setting_rules"),
    ("config", "job", "pretrained", "data", "hardware", "rundir", "worker"),
    ("parallel", "debug", "planner"),
    ("checkpoint",),
    ("train",),
    ("measure", "report", "launch", "testing"),
    ("cli", "__main__"),
]
"""From the ground up (docs/architecture.md says what each holds)."""

UPWARD = {
    ("shoal.train.__main__", "shoal.launch.session"):
        "`torchrun -m shoal.train RECIPE --out DIR` is the worker's public name; with no shoal launcher to "
        "prepare the job, each rank prepares it the one way every launch does",
}
"""The imports allowed to point up a floor, each with its reason."""

FLOOR = {package: n for n, packages in enumerate(FLOORS) for package in packages}


def module_name(path: Path) -> str:
    parts = path.relative_to(SHOAL.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in SHOAL.rglob("*.py")}


def shoal_imports(path: Path) -> set[str]:
    """The shoal modules `path` imports, anywhere in it, each resolved to the module itself (not a
    name inside it)."""
    me, package = module_name(path), path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package this module is in
                parts = me.split(".")[: len(me.split(".")) - node.level + package]
                base = ".".join(parts + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for target in targets:
            while target not in MODULES and "." in target:
                target = target.rsplit(".", 1)[0]
            if target.startswith("shoal.") and target != me:
                found.add(target)
    return found


GRAPH = {name: shoal_imports(path) for name, path in MODULES.items()}


def package(module: str) -> str:
    return module.split(".")[1]


def test_every_package_has_a_floor():
    assert {package(m) for m in MODULES if m != "shoal"} <= set(FLOOR)


def test_no_import_points_up_a_floor():
    """Without this, imports from a lower package to a higher one grew from 2 to 18 in two rounds of work."""
    up = {(m, t) for m, targets in GRAPH.items() if m != "shoal" for t in targets
          if FLOOR[package(t)] > FLOOR[package(m)]}
    assert up == set(UPWARD), sorted(up - set(UPWARD)) or f"no longer needed: {set(UPWARD) - up}"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one node."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    """Neither between modules (model/moe.py and transformer.py once imported each other) nor between
    packages, the allowed upward imports left out."""
    assert _cycles(GRAPH) == []
    packages = defaultdict(set)
    for m, targets in GRAPH.items():
        for t in targets:
            if m != "shoal" and package(m) != package(t) and (m, t) not in UPWARD:
                packages[package(m)].add(package(t))
    assert _cycles(packages) == []


def test_the_circle_finder_finds_circles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_workers_and_library_code_never_run_the_cli():
    """Only the cli package (and `python -m shoal`) imports shoal.cli: a worker never parses the
    command line of `shoal train` again."""
    assert {m for m, targets in GRAPH.items() for t in targets
            if package(t) == "cli" and package(m) not in ("cli", "__main__")} == set()


def imports_of(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", ["model", "planner"])
def test_no_torch_distributed(package):
    offenders = {p.name: sorted(i for i in imports_of(p) if i.startswith("torch.distributed"))
                 for p in (SHOAL / package).glob("*.py")}
    assert not {k: v for k, v in offenders.items() if v}


TORCH_FREE = ["layout.py", "layout_rules.py", "job.py", "config.py", "errors.py", "files.py", "comm/ops.py",
              "planner/*.py",
              "hardware/catalog.py", "hardware/gpu.py", "hardware/overrides.py", "hardware/local.py", "hardware/lookup.py", "rundir/*.py", "worker/env.py",
              "worker/exit*.py", "worker/process.py"]
"""The rules the planner shares with the trainer, the planner with the hardware it reads, and
everything a run's folder and a worker's start are checked with: they load where torch is not
installed, and the checks before a run cost no torch import."""


@pytest.mark.parametrize("pattern", TORCH_FREE)
def test_torch_free_modules_import_no_torch(pattern):
    for path in SHOAL.glob(pattern):
        assert not {i for i in imports_of(path) if i.split(".")[0] == "torch"}, path


def test_planner_runs_without_torch():
    """Importing the planner and planning a 405B model must not load torch at all."""
    code = ("import sys; from shoal.cli.main import main; "
            "main(['plan', '--model', 'llama3-405b', '--seq-len', '8192', '--global-batch', '2048', "
            "'--gpu', 'h100', '--gpus', '16384', '--top', '3']); "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


def test_the_launcher_imports_no_training_loop():
    """The launcher checks the job, tokenizes the corpus (shoal/train/data.py) and starts workers; the
    training loop's imports (DTensor, pipelining, checkpointing: 2.4 s of CPU) are the workers' alone."""
    code = ("import sys, shoal.launch.session, shoal.launch.local, shoal.train.data; "
            "heavy = [m for m in ('shoal.train.trainer', 'torch.distributed.tensor', 'torch.distributed.pipelining', "
            "'torch.distributed.checkpoint') if m in sys.modules]; assert not heavy, heavy")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


def test_layout_rules_have_one_home():
    """Only shoal/layout_rules.py raises about how a layout divides; nothing else restates its rules."""
    needles = ("needs at least pp=", "must divide n_heads={", "borrows data-parallel ranks")
    homes = {p.relative_to(SHOAL).as_posix() for p in SHOAL.rglob("*.py")
             if any(n in p.read_text() for n in needles)}
    assert homes == {"layout_rules.py"}, homes


def test_one_table_of_bus_factors():
    """nccl-tests' bus factors live in shoal/comm/ops.py only; everyone else imports them."""
    owners = {}
    for path in SHOAL.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else [
                t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
            for name in names:
                if name.lower() in ("bus_factor", "busbw", "algbw") or "BUS_FACTOR" in name.upper():
                    owners.setdefault(name, set()).add(str(path.relative_to(SHOAL)))
    assert owners and all(files == {"comm/ops.py"} for files in owners.values()), owners


def test_one_patch_layer():
    """Only shoal/comm/patch.py replaces ProcessGroup methods or functional collectives."""
    patchers = sorted(str(p.relative_to(SHOAL)) for p in SHOAL.rglob("*.py")
                      if "setattr(" in p.read_text() and ("ProcessGroup" in p.read_text() or "_c10d_functional" in p.read_text()))
    assert patchers == ["comm/patch.py"], patchers


def test_every_name_in_a_run_folder_is_spelled_once():
    """shoal/rundir/names.py spells the files of an output folder; nobody else writes them out."""
    spelled = {name: sorted(p.relative_to(SHOAL).as_posix() for p in SHOAL.rglob("*.py")
                            if f'"{name}"' in p.read_text())
               for name in ("metrics.jsonl", "run.json", "job.json", "shoal_model.json", "checkpoints")}
    assert all(files == ["rundir/names.py"] for files in spelled.values()), spelled


def test_no_function_is_longer_than_a_screen_and_a_half():
    """train() orchestrates in a screen; nothing in shoal/ runs past 80 lines."""
    lengths = {f"{path.relative_to(SHOAL)}:{node.name}": node.end_lineno - node.lineno + 1
               for path in SHOAL.rglob("*.py") for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    assert lengths["train/trainer.py:train"] <= 60
    assert {k: v for k, v in lengths.items() if v > 80} == {}


def test_test_files_have_unique_names():
    """pytest imports test modules by basename (tests/ is not a package): two files with one name
    stop the whole suite at collection."""
    from collections import Counter

    names = Counter(p.name for p in (SHOAL.parent / "tests").rglob("test_*.py"))
    assert not [n for n, k in names.items() if k > 1]
