"""Enumerate every valid layout for a model on N GPUs, keep the ones that fit, rank them.

A dimension the user fixed stays fixed; the others range over what divides: tp over divisors of
the head counts, pp up to the layer count, dp = N / (tp * cp * pp) (cp only for long sequences) dividing the global batch, ep over
divisors of dp and of the expert count, every ZeRO stage, power-of-two micro-batch sizes dividing
the per-rank batch, each recompute mode and schedule, interleaving factors from a short list; ep
over powers of two dividing dp and the expert count. Memory is checked
before time so layouts that cannot fit cost little, and floors from the layouts already computed skip
the breakdowns and timings that could not change the answer (_Floors, _best).
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from dataclasses import dataclass, field, replace

from shoal.errors import UserError
from shoal.planner.context_parallel import heads_problem
from shoal.planner.evaluate import Plan, evaluate
from shoal.layout import ACTIVATION_CHECKPOINT, INTERLEAVED, PLAN_ONLY_SCHEDULES, Layout, TrainerLimit
from shoal.layout_rules import max_pipeline_stages, model_limits, problems, splits_heads
from shoal.planner.workload import Cluster, Workload
from shoal.planner.memory import memory
from shoal.planner.timing import network, step_floor, step_time
from shoal.planner.torus import tp_reach

VIRTUAL_STAGES = (2, 3, 4, 5, 6, 8, 10, 12, 16)
"""Interleaving factors tried (chunks per pipeline rank)."""
MAX_MICRO_BATCH = 128
RANKINGS = ("throughput", "cost")


@dataclass(frozen=True)
class Fixed:
    """Layout dimensions the user pinned (None: searched); the trainer's names, dp being the whole
    data-parallel degree (the planner lays it on dp_shard; ZeRO decides whether it shards)."""

    dp: int | None = None
    dp_replicate: int | None = None
    """HSDP's replica groups (Layout.dp_replicate); None or 1: one group, ZeRO over the whole dp."""
    tp: int | None = None
    pp: int | None = None
    ep: int | None = None
    expert_tp: int | None = None
    """Megatron's ETP (Layout.expert_tp); None: experts split as each layout implies."""
    zero: int | None = None
    micro_batch: int | None = None
    activation_checkpoint: str | None = None
    pp_schedule: str | None = None
    pp_virtual_stages: int | None = None
    sequence_parallel: bool | None = None
    cp: int | None = None
    offload: str | None = None
    activation_offload: bool | None = None

    @property
    def complete(self) -> bool:
        pinned = (self.dp, self.tp, self.pp, self.zero, self.micro_batch, self.activation_checkpoint)
        return None not in pinned and (self.pp == 1 or self.pp_schedule is not None)


@dataclass
class SearchResult:
    plans: list[Plan]
    """Layouts that fit, best first."""
    closest_misses: list[Plan]
    """The layouts that do not fit but come closest (least memory), for the 'why not' table."""
    evaluated: int = 0
    fitting: int = 0
    dominated: int = 0
    """Layouts skipped because the same layout with less recomputation already fits (and is faster)."""
    rejected: Counter = field(default_factory=Counter)
    """Why layouts were thrown out: 'memory', 'trainer' (shoal train cannot run it yet) or the field
    that did not divide."""
    seconds: float = 0.0
    note: str = ""
    """Set when the layouts shown are ones shoal train cannot run yet."""

    @property
    def best(self) -> Plan | None:
        return self.plans[0] if self.plans else None


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _powers_of_two(n: int) -> list[int]:
    """1, 2, 4, ... that divide n: micro-batch and expert-parallel sizes worth trying."""
    out, p = [], 1
    while p <= n and n % p == 0:
        out.append(p)
        p *= 2
    return out


def candidate_groups(workload: Workload, n_gpus: int, fixed: Fixed, rejected: Counter | None = None,
                     max_tp: int | None = None, trainer_only: bool = False, per_node: int = 0):
    """Every layout that divides (no memory check), honouring the fixed dimensions, as (layout, recompute
    modes): the layout with each of those modes is a candidate (the layout carries the first).

    Recompute modes come innermost and lightest first, which `search` relies on to skip dominated
    ones. per_node (GPUs a node holds; 0: unknown) sets the HSDP groupings weighed (_replica_groups). Unless
    pinned, tp stays within max_tp (a node): tensor parallelism over the inter-node
    network is never competitive, and pinning --tp still evaluates it. With trainer_only (the search's
    first pass), interleaved schedules whose micro-batches are not a multiple of pp and the plan-only
    schedules (trainer limits) are left out early and counted as rejected by the trainer: cheaper than
    asking the layout rules about each.
    """
    cfg, B = workload.model, workload.global_batch
    rejected = Counter() if rejected is None else rejected
    tps = [fixed.tp] if fixed.tp else [t for t in _divisors(n_gpus) if splits_heads(cfg, t)
                                       and cfg.ffn_hidden % t == 0 and (not cfg.is_moe or cfg.expert_hidden % t == 0)
                                       and (max_tp is None or t <= max_tp)]
    recomputes = [fixed.activation_checkpoint] if fixed.activation_checkpoint else list(ACTIVATION_CHECKPOINT)
    for tp in tps:
        if n_gpus % tp:
            rejected["tp"] += 1
            continue
        for cp, pp in _cp_and_pp(workload, n_gpus, tp, fixed, rejected):
            dp = n_gpus // (tp * cp * pp)
            if fixed.dp and dp != fixed.dp:
                continue
            if fixed.dp_replicate and dp % fixed.dp_replicate:
                rejected["dp_replicate"] += 1
                continue
            zeros = [fixed.zero] if fixed.zero is not None else ([0, 1, 2, 3] if dp > 1 else [0])
            groupings = [(zero, replicas) for zero in zeros
                         for replicas in _replica_groups(dp, per_node // (tp * cp) if per_node else 0, zero, fixed)]
            # A batch that does not divide still yields one layout: the layout rules name the fix.
            mbs = ([fixed.micro_batch] if fixed.micro_batch else
                   [b for b in _powers_of_two(B // dp) if b <= MAX_MICRO_BATCH] if B % dp == 0 else [1])
            sps = [fixed.sequence_parallel] if fixed.sequence_parallel is not None else [tp > 1]
            for mb in mbs:
                m = B // (dp * mb) if B % (dp * mb) == 0 else 0
                for sched, v in _schedules(cfg.n_layers, pp, m, fixed, rejected if trainer_only else None):
                    for zero, replicas in groupings:
                        shard = dp // replicas
                        eps = [fixed.ep] if fixed.ep else ([e for e in _powers_of_two(shard) if cfg.n_experts % e == 0]
                                                           if cfg.is_moe else [1])
                        for ep in eps:
                            for sp in sps:
                                yield Layout(dp_replicate=replicas, dp_shard=shard, tp=tp, cp=cp, pp=pp, ep=ep,
                                             expert_tp=fixed.expert_tp or 0, zero=zero, micro_batch=mb,
                                             pp_schedule=sched, pp_virtual_stages=v, activation_checkpoint=recomputes[0],
                                             sequence_parallel=sp, offload=fixed.offload or "none",
                                             activation_offload=bool(fixed.activation_offload)), recomputes


def _replica_groups(dp: int, node_share: int, zero: int, fixed: Fixed) -> list[int]:
    """HSDP's replica-group counts worth weighing for a ZeRO stage: the pinned one, else 1 (ZeRO over all of dp)
    and the groups that shard over one node's data-parallel ranks (FSDP's HYBRID_SHARD) or 2, 4, ... nodes'
    (torchtitan's dp_shard over a few nodes): the shard group's gathers stay on NVLink or few rings, and only
    the reduced shards cross the whole data-parallel span. Zero 0 and 1 replicate or shard over the whole of dp
    (parallel/parallelize.py: HSDP is FSDP2's), so they weigh one group."""
    if fixed.dp_replicate:  # a replica group of one rank shards nothing: plain replication, which zero 0 plans
        return [fixed.dp_replicate] if zero < 2 or dp > fixed.dp_replicate else []
    if zero < 2 or dp == 1:
        return [1]
    out, shard = [1], max(2, node_share)
    while shard < dp:
        if dp % shard == 0:
            out.append(dp // shard)
        shard *= 2
    return out


CP_FROM_SEQ_LEN = 32768
"""Context parallelism is searched from this sequence length up (pinned with --cp at any): below it the
activations of one sequence fit beside the weights, and cp only adds a K/V ring. Llama 3 trained 8K
sequences with CP 1 and turned CP 16 on for its 128K stage (Table 4)."""
CP_SIZES = (2, 4, 8, 16, 32)


def _cp_and_pp(workload: Workload, n_gpus: int, tp: int, fixed: Fixed, rejected: Counter):
    """The (cp, pp) pairs to try beside this tp: pinned ones, else cp (long sequences only) and every pp."""
    if fixed.cp:
        cps = [fixed.cp]
    elif workload.seq_len < CP_FROM_SEQ_LEN:
        cps = [1]
    else:
        cps = [1] + [c for c in CP_SIZES if (n_gpus // tp) % c == 0 and workload.seq_len % (2 * c) == 0]
    for cp in cps:
        if heads_problem(workload.model, tp, cp, workload.cp_comm):  # Ulysses needs whole heads on every cp rank
            rejected["cp"] += 1
            continue
        pps = [fixed.pp] if fixed.pp else [p for p in _divisors(n_gpus // (tp * cp)) if p <= workload.model.n_layers]
        for pp in pps:
            if n_gpus % (tp * cp * pp):
                rejected["pp"] += 1
                continue
            yield cp, pp


def _schedules(n_layers: int, pp: int, m: int, fixed: Fixed, first_pass: Counter | None = None):
    if pp == 1:
        yield (fixed.pp_schedule or "1f1b"), (fixed.pp_virtual_stages or 1)
        return
    names = [fixed.pp_schedule] if fixed.pp_schedule else ["1f1b", "interleaved-1f1b", "zero-bubble", "gpipe", "dualpipe"]
    for name in names:
        if name in PLAN_ONLY_SCHEDULES and first_pass is not None and not fixed.pp_schedule:
            first_pass["trainer"] += 1  # the first pass keeps to what shoal train runs (layout.PLAN_ONLY_SCHEDULES)
            continue
        if name not in INTERLEAVED:
            yield name, (fixed.pp_virtual_stages or 1)
            continue
        # Micro-batches that are not a multiple of pp are a trainer limit (layout_rules.py), still planned when nothing
        # shoal train runs fits, so that a search and a pinned plan of the same layout agree.
        if first_pass is not None and m and m % pp:
            first_pass["trainer"] += 1
            continue
        vs = ([fixed.pp_virtual_stages] if fixed.pp_virtual_stages
              else [v for v in VIRTUAL_STAGES if pp * v <= max_pipeline_stages(n_layers)])
        for v in vs:
            yield name, v


def sort_key(rank_by: str):
    """Best first. By throughput, or by cost per token (GPU-hours per token): at one GPU count the
    two orders agree, since every layout pays for the same GPUs. Ties: less memory, simpler layout."""
    def key(p: Plan):
        lay = p.layout
        primary = p.cluster.n_gpus / p.tokens_per_s if rank_by == "cost" else -p.tokens_per_s
        return (primary, p.memory.total, lay.tp * lay.pp * lay.ep, lay.zero)
    return key


def search(workload: Workload, cluster: Cluster, fixed: Fixed = Fixed(), *, rank_by: str = "throughput",
           keep: int = 50, misses: int = 5) -> SearchResult:
    """All valid layouts of `workload` on `cluster`, the fitting ones ranked best first.

    Layouts shoal train cannot run yet are left out, unless nothing it can run fits: then the
    search runs again without that limit (planning for other trainers) and says so in `note`.
    """
    result = None
    if not model_limits(workload.model):  # else no layout of this model is one shoal train runs
        try:
            result = _search(workload, cluster, fixed, rank_by, keep, misses, trainer_only=True)
        except UserError:
            pass
    if result is None or (not result.plans and result.rejected["trainer"]):
        first = result
        result = _search(workload, cluster, fixed, rank_by, keep, misses, trainer_only=False)
        result.note = "nothing shoal train can run fits: these layouts need another trainer (no --emit)"
        if first is not None:
            result.seconds += first.seconds
    return result


def _search(workload: Workload, cluster: Cluster, fixed: Fixed, rank_by: str, keep: int, misses: int, *,
            trainer_only: bool) -> SearchResult:
    start = time.perf_counter()
    result = SearchResult(plans=[], closest_misses=[])
    invalid = Counter()
    first_invalid = first_limit = None
    fitting, missing = [], []  # (layout, memory): those that fit, and those that do not
    floors = _Floors(cluster.gpu.hbm_bytes, cluster.gpu.reserved_bytes, misses)
    for base, recomputes in candidate_groups(workload, cluster.n_gpus, fixed, result.rejected,
                                             max_tp=tp_reach(network(cluster).slice_shape, cluster.gpus_per_node),
                                             trainer_only=trainer_only, per_node=cluster.gpus_per_node):
        # The trainer's own rules (shoal/layout_rules.py): a layout kept here is one shoal train accepts. They read
        # the recompute mode only to check its name, so one verdict holds for the group.
        found = problems(base, workload.model, cluster.n_gpus, workload.global_batch, workload.seq_len)
        bad = next((p for p in found if not isinstance(p, TrainerLimit)), None)
        if bad:
            invalid[bad.field] += len(recomputes)
            first_invalid = first_invalid or bad
            continue
        limit = next((p for p in found if isinstance(p, TrainerLimit)), None) if trainer_only else None
        if limit:  # sound, but shoal train cannot run it yet: keep emitted recipes runnable
            result.rejected["trainer"] += len(recomputes)
            first_limit = first_limit or limit
            continue
        result.evaluated += len(recomputes)
        states = floors.states_of(base)
        if floors.cannot_fit(states):  # its weights, gradients and optimizer alone overflow, whatever it recomputes
            result.rejected["memory"] += len(recomputes)
            continue
        for i, rc in enumerate(recomputes):
            if floors.cannot_fit(states, floors.activations_of(base, rc)):  # a miss that would not be shown
                result.rejected["memory"] += 1
                continue
            layout = base if rc == base.activation_checkpoint else replace(base, activation_checkpoint=rc)
            mem = memory(workload, layout, cluster)
            floors.saw_memory(layout, mem)
            if not mem.fits:
                result.rejected["memory"] += 1
                missing.append((mem.total, layout, mem))
                continue
            fitting.append((layout, mem))
            # The same layout with more recomputation fits too, and is never faster.
            result.dominated += len(recomputes) - i - 1
            break
    result.rejected.update(invalid)
    if result.evaluated == 0:
        if first_invalid or first_limit:
            raise first_invalid or first_limit
        raise UserError("gpus", cluster.n_gpus, _no_layout_fix(workload, cluster.n_gpus, fixed))
    result.fitting = len(fitting)
    result.plans = _best(workload, cluster, fitting, rank_by, keep)
    missing.sort(key=lambda t: t[0])
    result.closest_misses = [Plan(workload, lay, cluster, mem, step_time(workload, lay, cluster))
                             for _, lay, mem in missing[:misses]]
    result.seconds = time.perf_counter() - start
    return result


class _Floors:
    """A floor under a layout's memory, from the siblings already computed, that lets the search skip the misses
    it would not show, without changing what it returns.

    Per pipeline stage, a layout's weights, gradients and optimizer state are the same whatever its micro-batch,
    recomputation or sequence parallelism, and its activations the same whatever its expert parallelism and ZeRO
    stage (memory.py). A layout whose floor overflows the GPU and is above the `misses` closest misses so far is a
    miss that would not be shown: that threshold only falls, so it would be out at the end too, and the test is
    strict, so ties keep their order. tests/unit/test_planner_search.py holds the invariances."""

    SLACK = 1e-9
    """Relative margin on the floors: a sibling's sum in another order may round one ulp apart."""

    def __init__(self, capacity: float, reserved: float, misses: int):
        self.capacity, self.reserved, self.misses = capacity, reserved, misses
        self.states, self.activations = {}, {}
        self.closest = []  # a heap (negated) of the `misses` smallest misses so far

    @staticmethod
    def _state_key(lay: Layout) -> tuple:
        return (lay.dp, lay.dp_replicate, lay.tp, lay.cp, lay.pp, lay.pp_schedule, lay.pp_virtual_stages, lay.ep,
                lay.zero)

    @staticmethod
    def _activation_key(lay: Layout, rc: str) -> tuple:
        return (lay.dp, lay.tp, lay.cp, lay.pp, lay.pp_schedule, lay.pp_virtual_stages, lay.micro_batch,
                lay.sequence_parallel, rc)

    def states_of(self, lay: Layout) -> dict:
        """Per stage, the weights, gradients and optimizer state seen for this layout's siblings."""
        return self.states.get(self._state_key(lay), _NONE)

    def activations_of(self, lay: Layout, rc: str) -> dict:
        """Per stage, the activations seen for this layout's siblings with recompute mode rc."""
        return self.activations.get(self._activation_key(lay, rc), _NONE)

    def cannot_fit(self, states: dict, acts: dict | None = None) -> bool:
        """Whether a layout with these parts (acts None: whatever it recomputes) is a miss that would not be shown."""
        if len(self.closest) < self.misses or acts is _NONE:
            return False  # too few misses yet, or nothing known beyond the group's states (asked first)
        floor = 0.0  # the largest known part of a stage, or sum of its parts
        acts = acts or _NONE
        for stage, value in states.items():
            floor = max(floor, value + acts.get(stage, 0.0))
        for value in acts.values():
            floor = max(floor, value)
        floor = (floor + self.reserved) * (1 - self.SLACK)
        return floor > self.capacity and (not self.closest or floor > -self.closest[0])

    def saw_memory(self, lay: Layout, mem) -> None:
        self.states.setdefault(self._state_key(lay), {}).setdefault(mem.stage, mem.params + mem.grads + mem.optimizer)
        self.activations.setdefault(self._activation_key(lay, lay.activation_checkpoint), {}).setdefault(
            mem.stage, mem.activations)
        if not mem.fits:
            _keep_smallest(self.closest, mem.total, self.misses)


def _best(workload: Workload, cluster: Cluster, fitting: list, rank_by: str, keep: int) -> list[Plan]:
    """The `keep` best of the fitting layouts, timing as few as it can: a step is never shorter than its floor
    (timing.step_floor, the same for every ZeRO stage), so layouts are timed in the order of that floor, and
    once the next floor is above the `keep` best steps timed, no layout left can rank (a strict test: ties keep
    their order)."""
    floors = {}

    def floor(lay: Layout) -> float:
        key = (lay.dp, lay.tp, lay.cp, lay.pp, lay.ep, lay.micro_batch, lay.pp_schedule, lay.pp_virtual_stages,
               lay.sequence_parallel, lay.activation_checkpoint)
        if key not in floors:
            floors[key] = step_floor(workload, lay, cluster) * (1 - _Floors.SLACK)
        return floors[key]

    order = sorted(range(len(fitting)), key=lambda i: floor(fitting[i][0]))
    plans, best = [], []  # best: a heap (negated) of the `keep` shortest steps so far
    for i in order:
        lay, mem = fitting[i]
        if len(best) == keep and (not best or floor(lay) > -best[0]):
            break
        plan = Plan(workload, lay, cluster, mem, step_time(workload, lay, cluster))
        plans.append((i, plan))
        _keep_smallest(best, plan.time.step, keep)
    plans.sort(key=lambda ip: ip[0])  # back in the search's order, which the sort's ties keep
    return sorted((p for _, p in plans), key=sort_key(rank_by))[:keep]


_NONE: dict = {}


def _keep_smallest(heap: list, value: float, n: int) -> None:
    """Keep the n smallest values seen in `heap` (negated, so its top is the largest of them)."""
    if len(heap) < n:
        heapq.heappush(heap, -value)
    elif heap and value < -heap[0]:
        heapq.heapreplace(heap, -value)


def evaluate_pinned(workload: Workload, layout: Layout, cluster: Cluster, *, interleave_given: bool = True) -> Plan:
    """A layout with every dimension given. An interleaved schedule whose interleaving factor was not given
    (papers rarely publish it: Llama 3 names V but not its value) gets the fastest factor the layer count
    allows, one that fits if any does, as a tuned run would have; the bubble is (p-1)/(v·m), so v matters."""
    if interleave_given or layout.pp_schedule not in INTERLEAVED:
        return evaluate(workload, layout, cluster)
    plans = []
    for v in VIRTUAL_STAGES:
        if layout.pp * v <= max_pipeline_stages(workload.model.n_layers):
            try:
                plans.append(evaluate(workload, replace(layout, pp_virtual_stages=v), cluster))
            except UserError:
                continue
    if not plans:
        return evaluate(workload, layout, cluster)  # raises the layout's own problem
    fitting = [p for p in plans if p.fits]
    return max(fitting or plans, key=lambda p: p.tokens_per_s)


def _no_layout_fix(workload: Workload, n_gpus: int, fixed: Fixed) -> str:
    pinned = {k: v for k, v in vars(fixed).items() if v is not None}
    if pinned:
        return f"no layout of {n_gpus} GPUs divides with {pinned}; drop one of these or change --gpus"
    return (f"no layout of {n_gpus} GPUs divides the model and a global batch of {workload.global_batch}; "
            f"use a GPU count that is a multiple of the head count's divisors and divides the batch")
