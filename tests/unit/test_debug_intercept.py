"""enable()/disable() in one process (a gloo world of 1): what is recorded, and that it all comes undone."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch._C._distributed_c10d import ProcessGroup, Work

import shoal.debug
from shoal.comm import ops
from shoal.debug.state import STATE
from tests.conftest import shoal_cli


@pytest.fixture()
def world_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    shoal.debug.disable()
    dist.destroy_process_group()


def test_records_call_sites_and_undoes_every_patch(world_of_one):
    originals = {name: vars(ProcessGroup)[name] for name in ("allreduce", "send", "all_gather_single")}
    wait, fc = vars(Work)["wait"], funcol.all_reduce
    shoal.debug.enable(check_collectives=True, hang_timeout_s=0)
    assert vars(ProcessGroup)["allreduce"] is not originals["allreduce"] and funcol.all_reduce is not fc

    x = torch.ones(3)
    dist.all_reduce(x); line = _lineno()  # noqa: E702  (the call and its line number together)
    rec = STATE.recent[-1]
    assert (rec.api, rec.group, rec.status) == ("all_reduce", "0", "done")
    assert rec.site == f"tests/unit/test_debug_intercept.py:{line} in test_records_call_sites_and_undoes_every_patch"
    seq = rec.seq
    funcol.all_reduce(x, "sum", dist.group.WORLD).wait()
    assert (STATE.recent[-1].api, STATE.recent[-1].seq) == ("funcol.all_reduce", seq + 1)

    shoal.debug.progress(3, "forward")
    assert (STATE.step, STATE.phase) == (3, "forward")

    shoal.debug.disable()
    assert {name: vars(ProcessGroup)[name] for name in originals} == originals
    assert vars(Work)["wait"] is wait and funcol.all_reduce is fc
    dist.all_reduce(x)  # the originals still work after being put back
    assert STATE.recent[-1].seq == seq + 1  # and nothing is recorded any more


def test_the_hang_clock_starts_when_the_watchdog_does(world_of_one):
    """Not at import: importing torch, reading data and building the model before enable() may take
    longer than hang_timeout_s (a short --hang-timeout reported every start as a hang)."""
    import time

    STATE.progress_t = time.time() - 1000  # imported long ago
    shoal.debug.enable(check_collectives=False, hang_timeout_s=5)
    assert time.time() - STATE.progress_t < 5


def test_the_first_step_is_published_at_once(world_of_one):
    """A rank's record goes to the store every interval (2 s here), so a rank killed soon after its first step
    was reported "before the first step". Before that step the watchdog looks for it every 0.1 s."""
    import time

    from shoal.debug import records

    STATE.step = -1
    shoal.debug.enable(check_collectives=False, hang_timeout_s=20)
    watchdog = shoal.debug._active["watchdog"]
    assert watchdog.interval == 2.0
    time.sleep(0.3)  # the first tick has published "before the first step"
    shoal.debug.progress(0, "forward")
    deadline = time.monotonic() + 1.0  # the next tick of a plain interval is 1.7 s away
    while records.read(watchdog.monitor.channel, [0])[0]["step"] < 0:
        assert time.monotonic() < deadline, "the first step was not published before the next interval"
        time.sleep(0.05)


def test_functional_collectives_dtensor_uses_are_covered():
    """If torch renames what DTensor calls, this fails instead of the checker silently missing it."""
    for name in ("all_reduce", "all_gather_single", "reduce_scatter_single", "all_to_all_single", "broadcast"):
        assert callable(getattr(funcol, name, None)) and name in ops.FUNCOL, name
    for op in ("allreduce", "all_gather_single", "reduce_scatter_single", "all_to_all_single", "send", "recv"):
        assert hasattr(ProcessGroup, op) and op in ops.PG_METHODS, op


def test_environment_overrides_arguments(monkeypatch):
    monkeypatch.setenv("SHOAL_CHECK_COLLECTIVES", "1")
    monkeypatch.setenv("SHOAL_HANG_TIMEOUT_S", "0")
    try:
        assert shoal.debug.enable(check_collectives=False, hang_timeout_s=60) == {
            "check_collectives": True, "hang_timeout_s": 0.0, "check_timeout_s": 300.0}
    finally:
        shoal.debug.disable()


def test_run_usage_errors_are_one_line_and_exit_2():
    r = shoal_cli("run", "--nproc", "2", timeout=60)
    assert r.returncode == 2 and "script" in r.stderr
    r = shoal_cli("run", "--nproc", "2", "no_such_script.py", timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no_such_script.py" in r.stderr


def test_importing_shoal_debug_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, shoal.debug; shoal.debug.progress(1, 'x'); assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def _lineno() -> int:
    import sys
    return sys._getframe(1).f_lineno
