"""A script from `shoal slurm` on a real one-node Slurm (Debian's slurm-wlm + munge), started and
stopped here: the job trains and writes metrics, its exit code reaches `sbatch --wait`, and a
`scancel --signal=TERM` mid-run is saved, requeued and resumed.

Skipped where slurm-wlm is not installed (`apt-get install slurm-wlm munge`, as root).
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO
from shoal.rundir.metrics import read_rows

pytestmark = pytest.mark.timeout(300)
PORTS = (29800, 29801, 29802)  # slurmctld, slurmd, the job's rendezvous


def _conf(d: Path, host: str) -> str:
    return f"""ClusterName=shoaltest
SlurmctldHost={host}
SlurmUser=root
SlurmctldPort={PORTS[0]}
SlurmdPort={PORTS[1]}
AuthType=auth/munge
AuthInfo=cred_expire=5
SchedulerParameters=bf_interval=1,sched_interval=2
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
NodeName={host} CPUs={os.cpu_count()} RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=30 State=UP OverSubscribe=YES
"""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    missing = [c for c in ("slurmctld", "slurmd", "sbatch", "munged") if not shutil.which(c)]
    if missing or os.geteuid() != 0:
        pytest.skip(f"no Slurm here: {'root needed' if not missing else 'missing ' + ', '.join(missing)} "
                    f"(apt-get install slurm-wlm munge)")
    d = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool"):
        (d / sub).mkdir()
    host = socket.gethostname().split(".")[0]
    (d / "slurm.conf").write_text(_conf(d, host))
    env = dict(os.environ, SLURM_CONF=str(d / "slurm.conf"))
    started = []
    try:
        if subprocess.run(["munge", "-n"], capture_output=True).returncode != 0:  # no munged yet: start ours
            Path("/run/munge").mkdir(exist_ok=True)
            shutil.chown("/run/munge", "munge", "munge")
            started.append(subprocess.Popen(["setpriv", "--reuid", "munge", "--regid", "munge", "--init-groups",
                                             "/usr/sbin/munged", "--foreground"], start_new_session=True,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            _until(lambda: subprocess.run(["munge", "-n"], capture_output=True).returncode == 0, "munged")
        for daemon in ("slurmctld", "slurmd"):
            started.append(subprocess.Popen([daemon, "-D"], env=env, start_new_session=True,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _until(lambda: "idle" in subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True,
                                                text=True).stdout, "an idle node in sinfo", d)
        yield env
    finally:
        for p in reversed(started):  # by pid, the ones this fixture started
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def _until(ok, what, d=None, timeout=30):
    deadline = time.time() + timeout
    while not ok():
        assert time.time() < deadline, f"{what} did not come up" + (
            f": {(d / 'slurmctld.log').read_text()[-1500:]}" if d and (d / "slurmctld.log").exists() else "")
        time.sleep(0.5)


def _script(slurm, tmp_path, name, *sets) -> Path:
    r = subprocess.run([sys.executable, "-m", "shoal", "slurm", "recipes/debug.toml", "--nodes", "1",
                        "--gpus-per-node", "0", "--name", name, "--port", str(PORTS[2]), "--python", sys.executable,
                        "--run-out", str(tmp_path / name), "--out", str(tmp_path), *[f"--set={s}" for s in sets]],
                       cwd=REPO, env=slurm, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return tmp_path / f"{name}.sbatch"


def _logs(run: Path) -> str:
    return "\n".join(p.read_text() for p in run.glob("slurm-*.out"))


def _sbatch(slurm, tmp_path, name, *sets):
    job = subprocess.run(["sbatch", "--wait", str(_script(slurm, tmp_path, name, *sets))], cwd=REPO, env=slurm,
                         capture_output=True, text=True, timeout=240)
    return job.returncode, tmp_path / name, _logs(tmp_path / name)


STEPS = 40
RUN = ("model.preset=debug", f"train.steps={STEPS}", "train.eval_every=0", "train.sample_tokens=0")


@pytest.fixture(scope="module")
def uninterrupted(slurm, tmp_path_factory):
    return _sbatch(slurm, tmp_path_factory.mktemp("slurm-ok"), "ok", *RUN)


def test_generated_script_trains_on_slurm(uninterrupted):
    code, run, logs = uninterrupted
    assert code == 0, logs
    assert len(read_rows(run)) == STEPS, logs


def test_job_exit_code_reaches_sbatch(slurm, tmp_path):
    code, _, logs = _sbatch(slurm, tmp_path, "bad", "model.preset=debug", "train.steps=3",
                            "data.path=/no/such/corpus")
    assert code != 0, logs
    assert "data.path='/no/such/corpus': no such file or directory" in logs, logs  # the worker's one line


def test_scancel_mid_run_saves_requeues_and_resumes_bitwise(slurm, tmp_path, uninterrupted):
    """SIGTERM to the job's steps (what preemption and the time limit send): the run saves the step
    it stops after and exits 75, the script requeues the job, and the second start resumes from that
    checkpoint and ends equal to the uninterrupted job, bit for bit, with every step logged once."""
    run = tmp_path / "pre"
    job = subprocess.Popen(["sbatch", "--wait", "--parsable", str(_script(slurm, tmp_path, "pre", *RUN))], cwd=REPO,
                           env=slurm, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    job_id = job.stdout.readline().strip().split(";")[0]
    _until(lambda: len(read_rows(run)) >= 3, "step 3", timeout=120)
    subprocess.run(["scancel", "--signal=TERM", job_id], env=slurm, check=True, timeout=30)
    assert job.wait(timeout=240) == 0, _logs(run) + job.stderr.read()
    logs = _logs(run)
    stop = int(logs.split("stopped by SIGTERM after step ")[1].split(";")[0])
    assert 3 <= stop < STEPS and f"requeueing job {job_id}" in logs, logs
    assert f"resuming from step {stop} ({run}/checkpoints/step_{stop:08d})" in logs, logs
    rows = read_rows(run)
    ref = read_rows(uninterrupted[1])
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), logs
    assert [r["loss"] for r in rows] == [r["loss"] for r in ref]
    weights = lambda r: (r / "model" / "model.safetensors").read_bytes()
    assert weights(run) == weights(uninterrupted[1])
