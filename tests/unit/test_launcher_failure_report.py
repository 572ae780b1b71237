"""Which worker the launcher names when an attempt fails: the one the others followed."""

from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from shoal.worker.exit_codes import HANG as HANG_EXIT_CODE
from shoal.launch.local import _FailureReport
from shoal.worker.exit_codes import LOST_PEER as LOST_PEER_EXIT_CODE


def failure(rank: int, code: int, timestamp: int) -> ProcessFailure:
    f = ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=code, error_file="/nonexistent")
    f.timestamp = timestamp  # the agent's are whole seconds: a killed worker and its peer often tie
    return f


def test_a_killed_worker_is_named_over_a_peer_that_lost_it_in_the_same_second(capsys):
    report = _FailureReport(nproc=4, max_restarts=2)
    # Set in the agent's order (local rank 1 polled before 3), as in the CI run where rank 1 was named.
    report.attempt_failed({1: failure(1, LOST_PEER_EXIT_CODE, 100), 3: failure(3, -9, 100),
                           0: failure(0, HANG_EXIT_CODE, 100)})
    assert capsys.readouterr().err.strip() == \
        "shoal: worker rank 3 (pid 1003) was killed by SIGKILL; restarting all 4 workers (restart 1 of 2)"


def test_the_earliest_cause_wins_and_followers_alone_still_name_one(capsys):
    report = _FailureReport(nproc=2, max_restarts=1)
    report.attempt_failed({1: failure(1, 1, 101), 0: failure(0, 3, 100)})
    report.attempt_failed({1: failure(1, LOST_PEER_EXIT_CODE, 100), 0: failure(0, LOST_PEER_EXIT_CODE, 100)})
    first, second = capsys.readouterr().err.strip().splitlines()
    assert first.startswith("shoal: worker rank 0 (pid 1000) exited with code 3; restarting all 2 workers")
    assert second == f"shoal: worker rank 0 (pid 1000) exited with code {LOST_PEER_EXIT_CODE}; no restarts left"


def test_without_restarts_the_launcher_says_nothing_per_attempt(capsys):
    _FailureReport(nproc=2, max_restarts=0).attempt_failed({0: failure(0, -9, 100)})
    assert capsys.readouterr().err == ""


def test_a_worker_the_agent_had_to_sigkill_is_named_as_frozen_not_killed_from_outside(capsys):
    """SIGSTOP on a worker: the others' watchdog reports the hang and exits 124, the agent's SIGTERM
    cannot reach the frozen one, and the agent SIGKILLs it; that is not a kill from outside."""
    import logging
    import signal

    report = _FailureReport(nproc=2, max_restarts=1)
    record = logging.LogRecord("torch.distributed.elastic.multiprocessing.api", logging.WARNING, "api.py", 1,
                               "Unable to shutdown process %s via %s, forcefully exiting via %s",
                               (1001, signal.SIGTERM, signal.SIGKILL), None)
    assert report.filter(record) is False  # the agent's own line is replaced by the one below
    report.attempt_failed({0: failure(0, HANG_EXIT_CODE, 100), 1: failure(1, -9, 130)})
    assert capsys.readouterr().err.strip() == (
        "shoal: worker rank 1 (pid 1001) stopped responding (frozen by SIGSTOP or a debugger, or stuck in the kernel "
        "through the launcher's SIGTERM), so the launcher killed it (the hang report above says where it stopped); "
        "restarting all 2 workers (restart 1 of 1)")


def test_a_frozen_worker_is_killed_at_once_and_the_run_ends_as_a_hang(capsys):
    """The agent's SIGTERM would wait 30 s on a SIGSTOPped worker, and the run exited 1 after it: the
    launcher kills stopped workers before the agent stops an attempt, and a frozen worker ends the run
    with the hang code (124)."""
    import signal
    import subprocess
    import time

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from shoal.launch.local import _failed

    frozen, running = (subprocess.Popen(["sleep", "60"]) for _ in range(2))
    try:
        frozen.send_signal(signal.SIGSTOP)
        report = _FailureReport(nproc=2, max_restarts=0)
        for _ in range(100):  # SIGSTOP is delivered asynchronously
            report.kill_frozen([frozen.pid, running.pid])
            if report.force_killed:
                break
            time.sleep(0.02)
        assert frozen.wait(timeout=5) == -signal.SIGKILL and running.poll() is None
        failures = {0: failure(0, HANG_EXIT_CODE, 100), 1: failure(1, -9, 100)}
        failures[1].pid = frozen.pid
        assert _failed(ChildFailedError("worker", failures), report, said_why=()) == HANG_EXIT_CODE
        assert "stopped responding" in capsys.readouterr().err
    finally:
        running.kill()
        frozen.kill()


def test_a_worker_the_agent_stopped_with_sigterm_is_not_named_over_the_one_that_failed(capsys):
    """Both ranks failed a save (its folder deleted under them): rank 1 exited 1, rank 0 was still on
    its way out when the agent sent it SIGTERM, in the same second; the failure is rank 1's."""
    _FailureReport(nproc=2, max_restarts=1).attempt_failed({0: failure(0, -15, 100), 1: failure(1, 1, 100)})
    assert capsys.readouterr().err.startswith("shoal: worker rank 1 (pid 1001) exited with code 1;")


def test_a_peer_gone_while_the_groups_form_is_recognized():
    """A rank that refused the model folder (NaN weights) left while its peer was in new_group: the
    peer printed a DistNetworkError traceback instead of its one line."""
    from torch.distributed import DistNetworkError

    from shoal.worker.exit import lost_peer

    said = lost_peer(DistNetworkError("Failed to recv, got 0 bytes. Connection was likely closed. Did the remote "
                                      "server shutdown or crash?"))
    assert said and said.startswith("Failed to recv")
    assert lost_peer(RuntimeError("CUDA out of memory")) is None


def test_a_refusal_only_a_non_first_worker_found_is_printed_once(tmp_path, monkeypatch, capsys):
    """Only local rank 0 prints a UserError. A rank that alone refused leaves its line (worker/said.py) and the
    launcher prints it; when a first worker refused too, it had printed already and nothing is added."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from shoal.errors import UserError
    from shoal.launch.local import _failed
    from shoal.train import __main__ as worker
    from shoal.worker.exit_codes import USER_ERROR
    from shoal.worker.said import SAID_DIR_ENV

    def refuse(args):
        raise UserError("model.init_from", "/m", "its share holds NaN")

    monkeypatch.setattr(worker, "run", refuse)
    monkeypatch.setattr(worker, "parse", lambda argv: None)
    monkeypatch.setattr(worker, "follow_the_launcher", lambda: None)
    monkeypatch.setenv(SAID_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert worker.main() == USER_ERROR
    assert capsys.readouterr().err == ""  # not this rank's to print

    def job(*failures):
        return ChildFailedError("shoal", dict(failures))

    report = _FailureReport(nproc=2, max_restarts=0)
    alone = job((1, failure(1, USER_ERROR, 100)), (0, failure(0, -15, 100)))
    assert _failed(alone, report, (USER_ERROR,), str(tmp_path)) == USER_ERROR
    assert capsys.readouterr().err.strip() == "shoal train: error: model.init_from='/m': its share holds NaN"
    both = job((1, failure(1, USER_ERROR, 100)), (0, failure(0, USER_ERROR, 101)))
    assert _failed(both, report, (USER_ERROR,), str(tmp_path)) == USER_ERROR
    assert capsys.readouterr().err == ""  # rank 0 printed its own
