"""The README's quickstart, run as written, in order, in a fresh folder: a promise to every new user.

Each command of the quickstart block must exit 0. The folder holds a copy of what a clone has at
its top (recipes/, examples/), so relative paths behave as in a fresh clone; commands later in
the block use what earlier ones wrote (runs/...), as a reader's would.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(900)


def quickstart_commands(readme: str) -> list[str]:
    """The commands of the first bash block under '## Quickstart', continuations joined, comments dropped."""
    section = readme.split("## Quickstart", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    commands, current = [], ""
    for line in block.splitlines():
        line = re.sub(r"\s+#\s.*$", "", line).rstrip()  # a trailing comment (never inside these commands)
        if not line or line.lstrip().startswith("#"):
            continue
        current += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            commands.append(current.strip())
            current = ""
    return commands


def test_quickstart_parses_into_commands():
    commands = quickstart_commands((REPO / "README.md").read_text())
    assert len(commands) >= 10 and all(c.split()[0] in ("shoal", "source") for c in commands), commands


def test_quickstart_runs_as_written(tmp_path):
    for folder in ("recipes", "examples"):
        shutil.copytree(REPO / folder, tmp_path / folder)
    bin_dir = Path(sys.executable).parent  # the environment's `shoal`, as `source .venv/bin/activate` gives
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", COLUMNS="200")
    env.pop("OMP_NUM_THREADS", None)
    for command in quickstart_commands((REPO / "README.md").read_text()):
        if command.startswith("source "):
            continue  # PATH above is what activating the environment does
        r = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"$ {command}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
        assert "Traceback" not in r.stderr, f"$ {command}\n{r.stderr[-3000:]}"
