"""A run is prepared once: job.json carries the resolved job to the workers, and the exit codes a run
ends with are one table, the README's."""

import json
import re
from dataclasses import asdict
from pathlib import Path

import pytest

from shoal.config import config_from_sections, load_config
from shoal.errors import UserError
from shoal.job import load_job, resolve
from shoal.worker import exit_codes

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("recipe,sets,world", [
    (None, [], 1),
    ("recipes/debug.toml", ["parallel.tp=2", "parallel.pp=2", "parallel.pp_schedule=interleaved-1f1b", "train.micro_batch=1",
                            "model.n_layers=4", "checkpoint.async=true", "checkpoint.every=5"], 8),
    ("recipes/debug.toml", ["model.preset=tiny-moe", "parallel.ep=2", "train.precision=bf16", "model.top_k=1",
                            "train.micro_batch=1",
                            "debug.hang_timeout_s=0", "data.tokenizer=byte"], 4),
])
def test_a_saved_job_is_the_job_the_workers_read(tmp_path, recipe, sets, world):
    """Everything the config, the world and the resolved layout hold comes back as it was, without
    resolving again (a worker checks nothing twice), with how to run it."""
    job = resolve(load_config(REPO / recipe if recipe else None, sets), world)
    path = job.save(tmp_path / "job.json", out=tmp_path / "run", resume="auto", show=False)
    again, how = load_job(path)
    assert again.cfg == job.cfg and again.layout == job.layout and again.world == job.world and again.model == job.model
    assert how == {"out": str(tmp_path / "run"), "resume": "auto", "show": False}
    assert config_from_sections(job.cfg.to_dict()) == job.cfg
    assert [p.name for p in tmp_path.iterdir()] == ["job.json"]  # its temporary name renamed into place
    assert json.loads(path.read_text())["layout"] == asdict(job.layout)


@pytest.mark.parametrize("content", ["", "{}", "[1]", '{"shoal_job": 1, "config": {"train": {"steps": "x"}}}'])
def test_a_job_file_shoal_did_not_write_is_one_line(tmp_path, content):
    (tmp_path / "job.json").write_text(content)
    with pytest.raises(UserError, match="--job"):
        load_job(tmp_path / "job.json")


def test_exit_codes_are_the_readmes():
    """worker/exit_codes.py is the one table; the README lists the same codes for `shoal train`."""
    text = (REPO / "README.md").read_text()
    paragraph = text[text.index("Exit codes of `shoal train`"):text.index("a crash.")]
    listed = {int(n) for n in re.findall(r"(?:^|[;:(] ?|\n)(\d+) ", paragraph)}
    table = {v for k, v in vars(exit_codes).items() if k.isupper() and isinstance(v, int)}
    assert listed == table, (sorted(listed), sorted(table))
