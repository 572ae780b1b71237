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
