"""The pipeline schedule a run used, laid out per rank over time, and its bubble fraction.

The order of work on each rank is the schedule's own: torch.distributed.pipelining's schedule
classes (the ones shoal/parallel/pipeline.py runs) list each rank's actions. Those lists carry
order, not time, so the timeline is simulated: every action starts as soon as the rank is free
and its inputs exist (a forward needs the previous stage's forward of that micro-batch, a
backward the next stage's backward, a weight-gradient its own input-gradient), with forward = 1,
input-gradient = 1, weight-gradient = 1 and a full backward = 2 time units, and sends free.
For GPipe and 1F1B that gives the textbook bubble (p - 1) / (m + p - 1) (tests check it).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

DURATION = {"F": 1.0, "I": 1.0, "W": 1.0, "B": 2.0}
KIND_NAME = {"F": "forward", "B": "backward", "I": "backward (input grad)", "W": "weight grad"}


@dataclass(frozen=True)
class Block:
    rank: int
    stage: int
    microbatch: int
    kind: str  # F, B, I or W
    start: float
    end: float


@dataclass(frozen=True)
class Timeline:
    schedule: str
    pp: int
    microbatches: int
    virtual: int
    blocks: list[Block]

    @property
    def makespan(self) -> float:
        return max(b.end for b in self.blocks)

    @property
    def bubble_fraction(self) -> float:
        """Idle share of (pipeline ranks x makespan)."""
        busy = sum(b.end - b.start for b in self.blocks)
        return 1.0 - busy / (self.pp * self.makespan)


def textbook_bubble(pp: int, microbatches: int) -> float:
    """GPipe's and 1F1B's bubble: (p - 1) / (m + p - 1)."""
    return (pp - 1) / (microbatches + pp - 1)


def _stand_in_stages(pp: int, virtual: int, rank: int) -> list:
    # The schedule constructors read only these attributes of a stage to compute the action lists;
    # real PipelineStages would need a process group and a model, and the order does not depend on them.
    n = pp * virtual
    return [SimpleNamespace(num_stages=n, group_size=pp, group_rank=rank, stage_index=rank + v * pp,
                            is_first=rank + v * pp == 0, is_last=rank + v * pp == n - 1, submod=None)
            for v in range(virtual)]


def schedule_actions(schedule: str, pp: int, microbatches: int, virtual: int = 1) -> dict[int, list[tuple]]:
    """{rank: [(kind, stage, microbatch), ...]} in the order the torch schedule runs them."""
    from shoal.parallel.pipeline import SCHEDULE_CLASSES

    cls = SCHEDULE_CLASSES[schedule]
    stages = _stand_in_stages(pp, virtual, 0)
    sched = cls(stages[0] if virtual == 1 else stages, microbatches, loss_fn=lambda out, target: out)
    order = {}
    for rank, actions in sorted(sched.pipeline_order.items()):
        order[rank] = [(a.computation_type.value, a.stage_index, a.microbatch_index)
                       for a in actions if a is not None and a.computation_type.value in DURATION]
    if virtual == 1:
        order = {r: _in_order(acts) for r, acts in order.items()}
    return order


def _in_order(actions: list[tuple]) -> list[tuple]:
    # Single-stage schedules (GPipe, 1F1B) run micro-batches strictly in order: the runtime counts
    # forwards and backwards separately. torch 2.13's 1F1B action list numbers the last rank's
    # forwards from 1 (its F0 is missing, an F{m} appears), which is why torch's own visualizer
    # reports a deadlock; renumbering by occurrence keeps the schedule's order and fixes the labels.
    seen = {"F": 0, "B": 0, "I": 0, "W": 0}
    out = []
    for kind, stage, _ in actions:
        out.append((kind, stage, seen[kind]))
        seen[kind] += 1
    return out


def simulate(schedule: str, pp: int, microbatches: int, virtual: int = 1) -> Timeline:
    """Each rank's actions placed in time (see the module docstring for the rules)."""
    order = schedule_actions(schedule, pp, microbatches, virtual)
    n_stages = pp * virtual
    done: dict[tuple, float] = {}  # (kind, stage, mb) -> end time
    free = {r: 0.0 for r in order}
    nxt = {r: 0 for r in order}
    blocks = []
    while any(nxt[r] < len(order[r]) for r in order):
        progressed = False
        for r in order:
            while nxt[r] < len(order[r]):
                kind, stage, mb = order[r][nxt[r]]
                ready = _ready(kind, stage, mb, n_stages, done)
                if ready is None:
                    break
                start = max(free[r], ready)
                end = start + DURATION[kind]
                done[(kind, stage, mb)] = end
                if kind == "B":  # a full backward also produces the input gradient
                    done[("I", stage, mb)] = end
                free[r] = end
                nxt[r] += 1
                blocks.append(Block(r, stage, mb, kind, start, end))
                progressed = True
        assert progressed, f"{schedule}: the action lists wait on each other: {nxt}"
    return Timeline(schedule, pp, microbatches, virtual, blocks)


def _ready(kind: str, stage: int, mb: int, n_stages: int, done: dict) -> float | None:
    """When the inputs of an action exist (None: not yet)."""
    if kind == "F":
        needs = [("F", stage - 1, mb)] if stage > 0 else []
    elif kind in ("B", "I"):
        needs = [("F", stage, mb)] + ([("I", stage + 1, mb)] if stage < n_stages - 1 else [])
    else:  # W
        needs = [("I", stage, mb)]
    if any(n not in done for n in needs):
        return None
    return max((done[n] for n in needs), default=0.0)
