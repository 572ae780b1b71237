"""Loss parity: every parallel layout trains like one process (through `shoal verify --json`)."""

import json
import math
import os

import pytest

from conftest import shoal_cli
from shoal.rundir.metrics import read_rows

pytestmark = pytest.mark.timeout(600)


def _rows(stdout: str) -> dict[str, tuple[float, bool]]:
    """layout -> (largest of the loss, grad-norm and weight differences, passed); inf for a run that died."""
    return {r["layout"]: (max(r[k] if r[k] is not None else float("inf") for k in ("loss_diff", "grad_diff", "weight_diff")),
                          r["passed"]) for r in json.loads(stdout)["results"]}


def test_composed_layouts_on_four_ranks(tmp_path):
    # Packed short documents with document masks: every window holds several, and the pipeline
    # stages pass the document indices on (an interleaved schedule, with experts, and TP x PP).
    docs = tmp_path / "short.jsonl"
    docs.write_text("".join(json.dumps({"text": f"doc {i}: " + "word " * (i % 17)}) + "\n" for i in range(2000)))
    masked = f"data.path={docs},data.document_mask=true"
    layouts = (
        "tp=2,pp=2;tp=2,dp_shard=2,zero=2;dp_replicate=2,dp_shard=2,zero=3;model=debug-moe,ep=2,dp_shard=4,zero=3;"
        "model=debug-moe,ep=2,dp_shard=2,pp=2,pp_schedule=gpipe;pp=2,dp_shard=2,zero=3,pp_schedule=zero-bubble;"
        "pp=2,dp_shard=2,zero=1,pp_schedule=gpipe;tp=2,dp_shard=2,zero=1;"
        # another rank order: the same groups' arithmetic, other ranks in each (DP, then PP, innermost)
        "tp=2,dp_shard=2,zero=2,rank_order=dp-tp-pp;pp=2,dp_shard=2,zero=3,pp_schedule=gpipe,rank_order=pp-dp-tp;"
        f"tp=2,pp=2,{masked};model=debug-moe,ep=2,dp_shard=2,pp=2,pp_schedule=interleaved-1f1b,{masked};"
        # context parallel: with tp, with FSDP over dp_shard x cp, with pp and documents; cp=4 alone
        # with documents inside a sliding window (every chunk pair's mask kind)
        f"cp=2,tp=2;cp=2,dp_shard=2,zero=3;cp=2,pp=2,pp_schedule=gpipe,{masked};"
        f"cp=4,model.sliding_window=12,{masked};"
        # dp inside cp: FSDP over them is refused (layout_rules.py), ZeRO-1's group is in rank order
        "cp=2,dp_shard=2,zero=1,rank_order=dp-tp-pp")
    # Two steps: the second step's loss and gradients come from weights the first update wrote, and
    # the final weights hold both updates (warmup gives each half and all of train.lr).
    r = shoal_cli("verify", "--nproc", "4", "--steps", "2", "--layouts", layouts, "--out", str(tmp_path / "runs"),
                  "--json", timeout=540)
    rows = _rows(r.stdout)
    assert r.returncode == 0 and len(rows) == 17, r.stdout[-3000:] + r.stderr[-3000:]
    assert all(passed for _, passed in rows.values()), r.stdout
    # Verify computes in float64: what is left is rounding, ~1e-15 here (fp32 left 1e-7 to 1e-6 and,
    # over 10 steps of tiny-moe on 4 ranks, up to 6.6e-4 for expert parallelism).
    assert all(diff <= 1e-9 for diff, _ in rows.values()), r.stdout
    # four ranks on (here) two cores: MFU is against the cores the job has, not four ranks' worth
    mfus = [r["mfu"] for run in (tmp_path / "runs").glob("layout*") for r in read_rows(run)]
    assert len(mfus) == 17 * 2 and all(0 < m <= 1 for m in mfus), mfus


# Bugs injected into the parallel workers only (WORLD_SIZE > 1 when they train; the reference runs in
# the launching process). sitecustomize runs when each process started after the launch's start does
# (the forkserver the workers are forked from, shoal/launch/forked.py, or each worker), before shoal
# trains. Each layout's run builds its own ParallelModel; the n-th one built gets BUGS[n] (a factor on
# every gradient, from a step on).
_INJECT = '''
import os
if "SHOAL_LAUNCHER_PID" in os.environ:
    from shoal.parallel import parallel_model

    bugs, built, original = {bugs}, [0], parallel_model.ParallelModel.forward_backward

    def injected(self, *args, **kwargs):  # whatever forward_backward takes
        if int(os.environ.get("WORLD_SIZE", "1")) == 1:
            return original(self, *args, **kwargs)
        if not hasattr(self, "_bug"):  # the first step of this layout's model
            self._bug, self._step, built[0] = bugs[built[0]], 0, built[0] + 1
        factor, from_step = self._bug
        self._step += 1
        loss = original(self, *args, **kwargs)
        if self._step >= from_step:
            for p in self.parameters():
                if p.grad is not None:
                    p.grad.mul_(factor)
            loss = loss * factor if factor != factor else loss  # NaN reaches the loss too
        return loss
    parallel_model.ParallelModel.forward_backward = injected
'''
# The same layout twice in one launch (two spellings, so verify reports each), one bug each: (factor, from step).
BUGS = {"dp_shard=2,zero=3": "(2.0, 1)", "zero=3,dp_shard=2": "(float('nan'), 3)"}


def test_verify_sees_what_the_loss_hides(tmp_path):
    """Summing instead of averaging gradients over 2 ranks (x2: AdamW is scale-invariant, so the loss
    barely moves) and a loss that turns NaN at step 3 must both fail verification."""
    (tmp_path / "sitecustomize.py").write_text(_INJECT.format(bugs=f"[{', '.join(BUGS.values())}]"))
    r = shoal_cli("verify", "--nproc", "2", "--steps", "4", "--layouts", ";".join(BUGS), "--json",
                  env={"PYTHONPATH": f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"}, timeout=300)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    rows = _rows(r.stdout)
    assert json.loads(r.stdout)["passed"] is False and sorted(rows) == sorted(BUGS), r.stdout
    assert not any(passed for _, passed in rows.values()), r.stdout  # each bug is seen, each in its own run:
    assert math.isfinite(rows["dp_shard=2,zero=3"][0]) and math.isinf(rows["zero=3,dp_shard=2"][0]), r.stdout


def test_compiled_blocks_train_like_eager():
    """train.compile=true (inductor, C++ on CPU) against the eager one-process reference: whole blocks
    under ZeRO-3, and attention + feed-forward under TP (compile.py says why). The cheapest compiled
    check (cold compilation is most of its time); DDP, ZeRO-1/2 with selective recompute, gpipe,
    1f1b, interleaved-1f1b and MoE with EP were verified the same way by hand (docs/parallelism.md)."""
    r = shoal_cli("verify", "--nproc", "2", "--steps", "3", "--layouts",
                  "dp_shard=2,zero=3,train.compile=true;tp=2,dp_shard=1,train.compile=true", "--json",
                  timeout=400)
    rows = _rows(r.stdout)
    assert r.returncode == 0 and len(rows) == 2, r.stdout[-3000:] + r.stderr[-3000:]
    assert all(passed and diff <= 1e-4 for diff, passed in rows.values()), r.stdout


@pytest.mark.timeout(300)
def test_the_reference_trains_what_the_layout_trains_and_no_earlier_run_is_read(tmp_path):
    """A layout's train.* fields reach its one-process reference (HOW_NOT_WHAT aside): without them
    train.precision=bf16 was compared with a float64 run from other random draws (0.11 in the loss,
    dp_shard=2, 3 steps), train.seq_len=32 with 64-token windows and an MoE's micro_batch=1 with 2
    (its load-balancing loss is per micro-batch: 1.6e-5 in the loss). And --out holding an earlier
    verify's runs: a layout with checkpoint.every found that verify's finished run in its folder,
    trained nothing and was reported from it (tp=2 passed on a dp_shard=2 run's files)."""
    from shoal.train.parity import config_for
    from shoal.train.trainer import train

    out = tmp_path / "runs"
    train(config_for("checkpoint.every=1", 1, 2, global_batch=8), out / "layout0", show=False)  # the earlier run
    r = shoal_cli("verify", "--nproc", "2", "--steps", "2", "--out", str(out), "--json", "--layouts",
                  "tp=2,dp_shard=1,checkpoint.every=1;dp_shard=2,train.precision=bf16,train.seq_len=32;"
                  "model=debug-moe,dp_shard=2,train.micro_batch=1", timeout=240)
    rows = _rows(r.stdout)
    assert r.returncode == 0 and len(rows) == 3, r.stdout[-3000:] + r.stderr[-3000:]
    assert all(passed for _, passed in rows.values()), r.stdout
    assert json.loads((out / "layout0" / "run.json").read_text())["layout"]["tp"] == 2


@pytest.mark.timeout(120)
def test_a_reference_that_stops_on_a_nonfinite_step_is_one_line():
    """train.lr=1e30 reaches the reference (above), whose NaN stopped verify with a traceback."""
    r = shoal_cli("verify", "--nproc", "2", "--steps", "2", "--layouts", "dp_shard=2,train.lr=1e30", timeout=90)
    assert r.returncode == 2 and "its one-process reference stopped: step 2" in r.stderr, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
