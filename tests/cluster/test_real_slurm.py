"""A script from `shoal slurm` on a real one-node Slurm (Debian's slurm-wlm + munge), started and
stopped here: the job trains and writes metrics, and its exit code reaches `sbatch --wait`.

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

pytestmark = pytest.mark.timeout(300)
PORTS = (29800, 29801, 29802)  # slurmctld, slurmd, the job's rendezvous


def _conf(d: Path, host: str) -> str:
    return f"""ClusterName=shoaltest
SlurmctldHost={host}
SlurmUser=root
SlurmctldPort={PORTS[0]}
SlurmdPort={PORTS[1]}
AuthType=auth/munge
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


def _sbatch(slurm, tmp_path, name, *sets):
    run = tmp_path / name
    r = subprocess.run([sys.executable, "-m", "shoal", "slurm", "recipes/debug.toml", "--nodes", "1",
                        "--gpus-per-node", "0", "--name", name, "--port", str(PORTS[2]), "--python", sys.executable,
                        "--run-out", str(run), "--out", str(tmp_path), *[f"--set={s}" for s in sets]],
                       cwd=REPO, env=slurm, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    job = subprocess.run(["sbatch", "--wait", str(tmp_path / f"{name}.sbatch")], cwd=REPO, env=slurm,
                         capture_output=True, text=True, timeout=240)
    logs = "\n".join(p.read_text() for p in run.glob("slurm-*.out"))
    return job.returncode, run, logs


def test_generated_script_trains_on_slurm(slurm, tmp_path):
    code, run, logs = _sbatch(slurm, tmp_path, "ok", "model.preset=debug", "train.steps=3", "train.eval_every=0",
                              "train.sample_tokens=0")
    assert code == 0, logs
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3, logs


def test_job_exit_code_reaches_sbatch(slurm, tmp_path):
    code, _, logs = _sbatch(slurm, tmp_path, "bad", "model.preset=debug", "train.steps=3",
                            "data.path=/no/such/corpus")
    assert code != 0, logs
    assert "data.path='/no/such/corpus': no such file or directory" in logs, logs  # the worker's one line
