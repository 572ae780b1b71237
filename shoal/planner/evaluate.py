"""One layout, evaluated: memory, step time, throughput, MFU, and the reasons it wins or fails."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cached_property

from shoal.layout import Layout, TrainerLimit
from shoal.layout_rules import problems
from shoal.model import analytics
from shoal.hardware.gpu import GiB
from shoal.planner.workload import Cluster, Workload
from shoal.planner.memory import MemoryBreakdown, memory
from shoal.planner.timing import StepTime, step_time

MEMORY_PARTS = ("params", "grads", "optimizer", "activations", "logits", "buffers", "overhead")
"""MemoryBreakdown's parts, which add up to its total."""
TIME_PARTS = ("compute", "recompute", "tp_comm", "pp_comm", "ep_comm", "fsdp_comm", "bubble", "dp_comm", "optimizer", "tail",
              "cp_comm", "offload")
"""StepTime's parts, which add up to its step."""


@dataclass(frozen=True)
class Plan:
    workload: Workload
    layout: Layout
    cluster: Cluster
    memory: MemoryBreakdown
    time: StepTime

    @property
    def fits(self) -> bool:
        return self.memory.fits

    @property
    def tokens_per_s(self) -> float:
        return self.workload.tokens_per_step / self.time.step

    @property
    def model_flops_per_step(self) -> float:
        return analytics.flops_per_token(self.workload.model, self.workload.seq_len) * self.workload.tokens_per_step

    @property
    def hardware_flops_per_step(self) -> float:
        extra = analytics.recompute_flops_per_token(self.workload.model, self.workload.seq_len,
                                                    self.layout.activation_checkpoint, self.workload.attention,
                                                    bool(self.cluster.gpu.xla_step))
        return self.model_flops_per_step + extra * self.workload.tokens_per_step

    @property
    def model_tflops_per_gpu(self) -> float:
        """Achieved model TFLOP/s per GPU (6·N_active + 12·L·H·S per token, no recomputation)."""
        return self.model_flops_per_step / self.time.step / self.cluster.n_gpus / 1e12

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation (DESIGN.md convention: recomputation not counted)."""
        peak = self.cluster.gpu.mfu_peak(self.workload.precision)
        return self.model_flops_per_step / (self.time.step * self.cluster.n_gpus * peak)

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilisation: recomputation counted."""
        peak = self.cluster.gpu.mfu_peak(self.workload.precision)
        return self.hardware_flops_per_step / (self.time.step * self.cluster.n_gpus * peak)

    @cached_property
    def reasons(self) -> list[str]:
        """What decides this layout, biggest first: memory verdict, then the costs beyond compute."""
        mem, t, lay, G = self.memory, self.time, self.layout, self.cluster.gpus_per_node
        out = []
        if not mem.fits:
            big = max(("params+grads+optimizer", mem.params + mem.grads + mem.optimizer),
                      ("activations", mem.activations), ("logits", mem.logits), key=lambda kv: kv[1])
            out.append(f"needs {mem.total / GiB:.0f} GiB > {mem.capacity / GiB:.0f} GiB ({big[0]} {big[1] / GiB:.0f} GiB)")
        costs = []
        if lay.pp > 1:
            costs.append((t.bubble, f"bubble {t.bubble / t.step:.0%}"))
        if lay.tp > 1:
            where = (f"on {self.cluster.gpu.fabric}" if t.tp_on_nvlink
                     else f"across nodes (tp {lay.tp}, {G} per node, rank order {lay.rank_order})")
            costs.append((t.tp_comm, f"TP comm {where} {t.tp_comm / t.step:.0%}"))
        if t.recompute > 0:
            costs.append((t.recompute, f"{lay.activation_checkpoint} recompute {t.recompute / t.step:.0%}"))
        if t.ep_comm > 0:
            costs.append((t.ep_comm, f"all-to-all {t.ep_comm / t.step:.0%}"))
        if t.fsdp_comm > 0:
            costs.append((t.fsdp_comm, f"ZeRO-{lay.zero} comm exposed {t.fsdp_comm / t.step:.0%}"))
        if lay.dp > 1 and t.dp_comm_total > 0 and lay.zero < 3:
            hidden = 1 - min(1.0, t.dp_comm / t.dp_comm_total)
            costs.append((t.dp_comm, f"DP sync {hidden:.0%} hidden" if t.dp_comm / t.step < 0.02
                          else f"DP sync exposed {t.dp_comm / t.step:.0%}"))
        if lay.activation_offload:
            costs.append((t.offload, f"{mem.offloaded_share:.0%} of activations offloaded, "
                                     f"copies {t.offload / t.step:.0%}"))
        if t.pp_comm / t.step >= 0.02:
            costs.append((t.pp_comm, f"PP send/recv {t.pp_comm / t.step:.0%}"))
        costs.sort(key=lambda c: -c[0])
        limit = self.trainer_limit
        if limit:
            out.append(f"shoal train cannot run this yet ({limit.fix})")
        out += [text for _, text in costs[:3]]
        if mem.fits:
            out.append(f"{mem.total / GiB:.0f}/{mem.capacity / GiB:.0f} GiB")
        return out

    @cached_property
    def trainer_limit(self) -> TrainerLimit | None:
        """Why shoal train cannot run this sound layout yet, or None."""
        wl = self.workload
        found = problems(self.layout, wl.model, self.cluster.n_gpus, wl.global_batch, wl.seq_len)
        return next((p for p in found if isinstance(p, TrainerLimit)), None)

    def as_dict(self) -> dict:
        """The `shoal plan --json` contract for one plan (docs/planner.md): `strategy` is the layout in
        the trainer's field names; memory in GiB and time in seconds, each with a breakdown that sums
        to the total. render.plan_dict adds `days` and `usd` when a token budget is given."""
        lay, mem, t = self.layout, self.memory, self.time
        return {
            "strategy": {**asdict(lay), "dp": lay.dp, "virtual_stages": lay.virtual_stages,
                         "microbatches": t.microbatches},
            "attention": self.workload.attention,
            "precision": self.workload.precision,
            "fits": self.fits,
            "memory_gib": mem.total / GiB,
            "memory_capacity_gib": mem.capacity / GiB,
            "memory_breakdown_gib": {k: getattr(mem, k) / GiB for k in MEMORY_PARTS},
            "memory_peak_stage": mem.stage,
            "host_memory_gib": mem.host / GiB,
            "offloaded_activation_share": mem.offloaded_share,
            "step_time_s": t.step,
            "time_breakdown_s": {k: getattr(t, k) for k in TIME_PARTS},
            "bubble_fraction": t.bubble_fraction,
            "dp_comm_total_s": t.dp_comm_total,
            "tokens_per_s": self.tokens_per_s,
            "tflops_per_gpu": self.model_tflops_per_gpu,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "reasons": self.reasons,
        }


def evaluate(workload: Workload, layout: Layout, cluster: Cluster, *, check: bool = True) -> Plan:
    """Memory and time of one layout. With check, a layout that cannot run raises UserError."""
    if check:
        found = [p for p in problems(layout, workload.model, cluster.n_gpus, workload.global_batch, workload.seq_len)
                 if not isinstance(p, TrainerLimit)]  # sound layouts shoal train cannot run yet are still planned
        if found:
            raise found[0]
    return Plan(workload, layout, cluster, memory(workload, layout, cluster), step_time(workload, layout, cluster))
