"""The collective checker on 3 gloo ranks: each injected mismatch is named before anything hangs.

One `shoal run --nproc 3` goes through every scenario in order (a mismatch is raised before the
collective is issued, so the ranks stay in step and the next scenario can run); each rank writes
what it caught to a JSON file, and each test below checks one scenario. The last scenario (a
rank that never arrives) desynchronizes the ranks on purpose, so it comes last.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import shoal_cli

SCRIPT = r'''
import json, os, sys, time
import torch
import shoal.debug
shoal.debug.enable(check_collectives=True, hang_timeout_s=30, check_timeout_s=3)
import torch.distributed as dist
from shoal.debug import CollectiveMismatchError
from shoal.debug.state import STATE

dist.init_process_group("gloo")
rank, out = dist.get_rank(), sys.argv[1]
results = {}

def scenario(name, fn):
    try:
        fn()
        results[name] = None
    except CollectiveMismatchError as e:
        results[name] = str(e)

def healthy():  # every op, consistent on all ranks: must pass
    x = torch.ones(4, 8)
    dist.all_reduce(x)
    dist.all_gather_into_tensor(torch.zeros(12, 8), x)
    dist.reduce_scatter_tensor(torch.zeros(4, 8), torch.ones(12, 8))
    splits = [[1, 2, 1], [2, 1, 1], [1, 1, 2]]            # row i: what rank i sends to each rank
    send, recv = splits[rank], [splits[j][rank] for j in range(3)]
    dist.all_to_all_single(torch.zeros(sum(recv), 2), torch.ones(sum(send), 2), recv, send)
    dist.broadcast(x, src=1)
    dist.scatter(torch.zeros(2), [torch.ones(2)] * 3 if rank == 0 else None, src=0)
    ops = [dist.P2POp(dist.isend, torch.ones(3), (rank + 1) % 3), dist.P2POp(dist.irecv, torch.zeros(3), (rank - 1) % 3)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    if rank == 0:
        dist.send(torch.ones(5), 1)
    elif rank == 1:
        dist.recv(torch.zeros(5))  # from any source: checked on the sender's side once it arrives
    objs = [None] * 3
    dist.all_gather_object(objs, {"rank": rank})
    dist.barrier()

def shape():
    x = torch.ones(4, 9) if rank == 1 else torch.ones(4, 8)
    dist.all_reduce(x)  # @shape

def op():
    if rank == 2:
        dist.all_gather(list(torch.zeros(3, 4, 8)), torch.ones(4, 8))  # @op-gather
    else:
        dist.all_reduce(torch.ones(4, 8))  # @op-reduce

def a2a():
    plan = [[1, 2, 1], [2, 1, 1], [1, 1, 2]]          # row i: rows rank i sends to each rank
    send, recv = plan[rank], [plan[j][rank] for j in range(3)]
    if rank == 0:
        send = [1, 1, 1]                              # rank 1 still expects 2 rows from rank 0
    dist.all_to_all_single(torch.zeros(sum(recv), 2), torch.ones(sum(send), 2), recv, send)

def skip():
    for step in range(3):
        if not (rank == 1 and step == 1):             # rank 1 skips the gradient all-reduce once
            dist.all_reduce(torch.ones(4))  # @skip-a
        dist.all_reduce(torch.ones(2))  # @skip-b

def pipeline():  # two pipeline stages on ranks 0,1 disagree on the activation shape
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    pp = dist.new_group([0, 1])
    if rank < 2:
        width = 16 if rank == 0 else 32               # stage 1 was built for 32 features; stage 0 sends 16
        stage = PipelineStage(torch.nn.Linear(width, 16), rank, 2, torch.device("cpu"),
                              input_args=(torch.zeros(2, width),), output_args=(torch.zeros(2, 16),), group=pp)
        schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda y, t: y.sum())
        if rank == 0:
            schedule.step(torch.randn(4, 16))  # @pp-send
        else:
            schedule.step(target=torch.zeros(4, 16))  # @pp-recv

def coverage():  # FSDP2, DTensor and DDP traffic passes the checker, and the checker sees it
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.nn.parallel import DistributedDataParallel
    STATE.recent.clear()
    mesh = init_device_mesh("cpu", (3,))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    fully_shard(model, mesh=mesh)
    model(torch.randn(2, 8)).sum().backward()
    seen = {c.api for c in STATE.recent}
    distribute_tensor(torch.arange(12.).reshape(6, 2), mesh, [Shard(0)]).redistribute(mesh, [Replicate()])
    seen |= {c.api for c in STATE.recent}
    ddp = DistributedDataParallel(torch.nn.Linear(4, 4))
    shoal.debug.watch_ddp(ddp)
    ddp(torch.randn(2, 4)).sum().backward()
    seen |= {c.api for c in STATE.recent}
    results["coverage_ops"] = sorted(seen)

def spread():  # per-step compute time: rank 2 is 3x slower than the others
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(shoal.debug.stragglers.PERSIST_STEPS):  # named once it has stayed slow that long
            results["spread_out"] = shoal.debug.stragglers.step_spread(0.3 if rank == 2 else 0.1)
    results["spread_warnings"] = [str(w.message) for w in caught if "straggler" in str(w.message)]

def missing():  # rank 1 never reaches the barrier; it waits (outside torch) until the others are done
    if rank == 1:
        shoal.debug.progress(7, "idle")
        deadline = time.time() + 20
        while time.time() < deadline and not all(os.path.exists(os.path.join(out, f"rank{r}.json")) for r in (0, 2)):
            time.sleep(0.1)
    else:
        dist.barrier()  # @missing

for name, fn in [("healthy", healthy), ("shape", shape), ("op", op), ("a2a", a2a), ("skip", skip),
                 ("pipeline", pipeline), ("coverage", coverage), ("spread", spread), ("missing", missing)]:
    scenario(name, fn)
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump(results, f)
'''


def _line(marker: str) -> int:
    """Line number of `# @marker` in SCRIPT (as written to scenarios.py)."""
    for i, text in enumerate(SCRIPT.splitlines(), start=0):
        if text.rstrip().endswith(f"# @{marker}"):
            return i
    raise AssertionError(marker)


@pytest.fixture(scope="module")
def caught(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("checker")
    script = tmp / "scenarios.py"
    script.write_text(SCRIPT.lstrip("\n"))
    result = shoal_cli("run", "--nproc", "3", str(script), str(tmp), timeout=150)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return {r: json.loads((tmp / f"rank{r}.json").read_text()) for r in range(3)}


def _row(table: str, label: str) -> str:
    return next(line for line in table.splitlines() if line.strip().startswith(label))


pytestmark = pytest.mark.timeout(180)


def test_consistent_collectives_pass(caught):
    for r in range(3):
        assert caught[r]["healthy"] is None, caught[r]["healthy"]


def test_shape_mismatch_names_ranks_shapes_and_line(caught):
    for r in range(3):  # every rank raised the same table
        msg = caught[r]["shape"]
        assert "ranks disagree on shapes" in msg
        assert "ranks 0,2" in msg and "rank 1" in msg
        row = _row(msg, "shapes *")
        assert row.index("(4, 8)") < row.index("(4, 9)")  # the majority column first, then rank 1
        assert f"scenarios.py:{_line('shape')}" in msg


def test_op_mismatch_names_both_sides(caught):
    for r in range(3):
        msg = caught[r]["op"]
        assert "ranks disagree on op" in msg
        assert re.search(r"op \*\s*\|\s*all_reduce\s*\|\s*all_gather", msg), msg
        assert f"scenarios.py:{_line('op-reduce')}" in msg and f"scenarios.py:{_line('op-gather')}" in msg
        assert "ranks 0-1" in msg and "rank 2" in msg


def test_all_to_all_split_mismatch(caught):
    for r in range(3):
        msg = caught[r]["a2a"]
        assert "split sizes" in msg
        assert "group rank 0 sends 1 rows to group rank 1, which expects 2" in msg


def test_skipped_collective(caught):
    for r in range(3):
        msg = caught[r]["skip"]
        assert "ranks disagree on shapes" in msg
        assert "skipped or added a collective" in msg
        # the others are at the gradient all-reduce, rank 1 already at the next one
        assert f"scenarios.py:{_line('skip-a')}" in msg and f"scenarios.py:{_line('skip-b')}" in msg
        assert re.search(r"shapes \*\s*\|\s*\(4,\)\s*\|\s*\(2,\)", msg), msg


def test_pipeline_stages_disagree_on_activation_shape(caught):
    for r in (0, 1):
        msg = caught[r]["pipeline"]
        assert "point-to-point mismatch" in msg and "from rank 0 to rank 1" in msg
        assert re.search(r"shapes \*\s*\|\s*\(2, 16\)\s*\|\s*\(2, 32\)", msg), msg
        assert f"scenarios.py:{_line('pp-send')}" in msg and f"scenarios.py:{_line('pp-recv')}" in msg
        assert "pipelining/schedules.py" in msg  # where inside torch the send/recv was issued
    assert caught[2]["pipeline"] is None  # not a stage: nothing to raise


def test_fsdp_dtensor_ddp_are_checked_without_false_alarms(caught):
    for r in range(3):
        assert caught[r]["coverage"] is None, caught[r]["coverage"]
        ops = set(caught[r]["coverage_ops"])
        assert {"all_gather_single", "reduce_scatter_single"} <= ops  # FSDP2 all-gather / reduce-scatter
        assert "funcol.all_gather_single" in ops  # DTensor redistribute (functional collectives)
        assert "all_reduce" in ops  # DDP bucket all-reduce through watch_ddp


def test_step_spread_names_the_straggler(caught):
    for r in range(3):
        out = caught[r]["spread_out"]
        assert out["slowest_rank"] == 2 and out["stragglers"] == [2]
        assert out["compute_time_spread"] == pytest.approx(3.0)
    assert len(caught[0]["spread_warnings"]) == 1 and "rank 2 is a straggler" in caught[0]["spread_warnings"][0]
    assert caught[1]["spread_warnings"] == [] and caught[2]["spread_warnings"] == []  # warned once, by rank 0


def test_missing_rank_is_named_with_where_it_is(caught):
    assert caught[1]["missing"] is None
    for r in (0, 2):
        msg = caught[r]["missing"]
        assert "rank 1 did not arrive within 3 s" in msg
        assert "phase 'idle'" in msg and "step 7" in msg
        assert f"scenarios.py:{_line('missing')}" in msg
