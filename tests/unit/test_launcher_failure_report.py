"""Which worker the launcher names when an attempt fails: the one the others followed."""

from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from shoal.debug.state import HANG_EXIT_CODE
from shoal.launch.local import _FailureReport
from shoal.launch.worker_exit import LOST_PEER_EXIT_CODE


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
