"""DESIGN.md's import rules: model/ and planner/ never import torch.distributed; the planner imports no torch."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SHOAL = Path(__file__).resolve().parents[2] / "shoal"


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


@pytest.mark.parametrize("module", ["layout.py", "job.py", "config.py", "errors.py"])
def test_the_layout_rules_import_no_torch(module):
    """The rules the planner shares with the trainer must load where torch is not installed."""
    assert not {i for i in imports_of(SHOAL / module) if i == "torch" or i.startswith("torch.")}


def test_layout_rules_have_one_home():
    """Only shoal/layout.py raises about how a layout divides; nothing else restates its rules."""
    needles = ("needs at least pp=", "must divide n_heads={", "borrows data-parallel ranks")
    homes = {p.relative_to(SHOAL).as_posix() for p in SHOAL.rglob("*.py")
             if any(n in p.read_text() for n in needles)}
    assert homes == {"layout.py"}, homes


def test_planner_runs_without_torch():
    """Importing the planner and planning a 405B model must not load torch at all."""
    code = ("import sys; from shoal.cli.main import main; "
            "main(['plan', '--model', 'llama3-405b', '--seq-len', '8192', '--global-batch', '2048', "
            "'--gpu', 'h100', '--gpus', '16384', '--top', '3']); "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


def test_collective_table_is_torch_free():
    """The planner reads bus factors from shoal/comm/ops.py, so that file imports no torch either."""
    for path in [SHOAL / "comm" / "ops.py", *(SHOAL / "planner").glob("*.py")]:
        assert not {i for i in imports_of(path) if i.split(".")[0] == "torch"}, path


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


def test_test_files_have_unique_names():
    """pytest imports test modules by basename (tests/ is not a package): two files with one name
    stop the whole suite at collection."""
    from collections import Counter

    names = Counter(p.name for p in (SHOAL.parent / "tests").rglob("test_*.py"))
    assert not [n for n, k in names.items() if k > 1]
