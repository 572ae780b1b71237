"""`shoal train --launcher ray`: the debug recipe on 2 Ray Train workers (gloo, CPU) computes what one
process computes, and a failure in the workers is one line and shoal's exit code.

One local Ray instance (2 CPUs, no dashboard, bound to 127.0.0.1) serves the module and is shut
down after; the launcher finds it already started and leaves it running.
"""

import json
import os
import shutil
import tempfile

import pytest
import ray
import torch
from ray.exceptions import ActorDiedError
from ray.train import WorkerGroupError

from conftest import REPO
from shoal.cli.main import main
from shoal.errors import UserError
from shoal.launch.ray import exit_code
from shoal.rundir import lock as rundir
from shoal.train.parity import compare

pytestmark = pytest.mark.timeout(240)

RECIPE = str(REPO / "recipes" / "debug.toml")
STEPS = ["--set", "train.steps=4", "--set", "train.sample_tokens=0", "--quiet"]


@pytest.fixture(scope="module")
def local_ray():
    temp = tempfile.mkdtemp(prefix="ray-h-")  # short: Ray's socket paths inside must fit 107 bytes
    saved = os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray's "local only": every address 127.0.0.1
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=temp)
    yield
    ray.shutdown()
    if saved is None:
        os.environ.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    else:
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = saved
    shutil.rmtree(temp, ignore_errors=True)


def test_two_ray_workers_match_one_process(local_ray, tmp_path, capfd):
    out = tmp_path / "ray"
    assert main(["train", RECIPE, *STEPS, "--launcher", "ray", "--nproc", "2", "--out", str(out)]) == 0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the workers' thread count (Ray gives each one CPU): the same sums
    try:
        assert main(["train", RECIPE, *STEPS, "--out", str(tmp_path / "one")]) == 0
    finally:
        torch.set_num_threads(threads)
    run = json.loads((out / "run.json").read_text())
    assert run["world"] == 2 and run["layout"]["dp_shard"] == 2, run  # the default layout: dp=2 (FSDP)
    result = compare("ray dp_shard=2", out, tmp_path / "one", tolerance=1e-4)
    assert result.loss_diff <= 1e-6 and result.passed, result
    rundir.lock(out)  # the launcher let go of the run directory's lock
    rundir.release(out)
    assert "Traceback" not in capfd.readouterr().err


def test_a_worker_failure_is_one_line_and_its_exit_code(local_ray, tmp_path, capfd):
    # lr 1e30: the gradients overflow at step 2 on both workers, which stop (train.on_nonfinite=stop)
    argv = ["train", RECIPE, *STEPS, "--set", "train.lr=1e30", "--set", "train.warmup_steps=0",
            "--launcher", "ray", "--nproc", "2", "--out", str(tmp_path / "nan")]
    assert main(argv) == 3
    err = capfd.readouterr().err
    assert "Traceback" not in err
    assert [line for line in err.splitlines() if "shoal" in line] == [err.strip().splitlines()[-1]]
    assert err.strip().splitlines()[-1].startswith("shoal train: error: step 2: ")


def test_exit_codes_of_ray_failures(capsys):
    died = ActorDiedError()
    cases = [(None, 0, None), (WorkerGroupError("x", {1: died, 0: UserError("data.path", "x", "fix")}), 2,
                               "shoal train: error: data.path='x': fix"),
             (WorkerGroupError("x", {1: died}), 1, "shoal: Ray worker rank 1 of 2 failed: ActorDiedError: "),
             (RuntimeError("the cluster went away"), 1, "shoal: the Ray job failed: RuntimeError: the cluster went away")]
    for error, code, line in cases:
        assert exit_code(error, 2) == code
        err = capsys.readouterr().err
        assert (err.strip().splitlines() == [] if line is None else
                len(err.strip().splitlines()) == 1 and err.startswith(line)), err
