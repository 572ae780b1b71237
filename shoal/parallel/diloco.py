"""DiLoCo: data-parallel replica groups that talk once every H steps (`parallel.diloco_inner_steps`).

Each dp_replicate group trains on its own for H inner steps: its inner optimizer (AdamW, or SGD)
and its gradient reduction stay inside the group (dp_shard, sharded as without DiLoCo), because
parallelize.py builds data parallelism over the group's ranks only. Every H steps an outer step:

    delta = outer - params                      the pseudo-gradient (a descent direction: the inner
                                                steps moved params from outer along -gradient)
    delta = mean over groups of delta           one all-reduce over the dp_replicate mesh axis
    buf = mu * buf + delta                      SGD with Nesterov momentum (DiLoCo: lr 0.7, mu 0.9),
    outer -= lr * (delta + mu * buf)            torch.optim.SGD's formula; mu = 0: plain SGD
    params = outer                              every group starts the next round from the same point

The sign: with lr 1 and mu 0 the outer step sets params to the mean of the groups' params, which
is data-parallel SGD when H = 1 and the inner optimizer is SGD (tests/dist/test_diloco.py); torchft
and torchtitan both shipped `outer += lr * delta` once, which walks away from what the groups learnt.

Streaming DiLoCo (Douillard et al. 2025, `parallel.diloco_fragments` = F): the parameters are cut
into F contiguous fragments of about equal size, and fragment j has its outer step at the steps
where step % H == j * H // F, so each step sends at most 1/F of the model (a lower peak) and the
average is still once per H steps. Each due fragment's all-reduce is issued as an async work
handle and waited just before that fragment is applied, so one fragment's transfer overlaps the
outer update of the fragment before it. The pseudo-gradient can go on the wire in bf16, int8 or 4 bits
(`parallel.diloco_quantize`; int8 and fp4 are compression.py's quantize -> all-to-all -> mean ->
quantize -> all-gather). The last step of a run syncs every fragment, so the run ends with one model.

Overlap (`parallel.diloco_overlap_steps` = tau >= 1, Streaming DiLoCo's overlapped communication):
a due fragment's pseudo-gradient is sent at step t and its all-reduce runs on Gloo's or NCCL's
threads beside the next tau inner steps; at step t + tau the outer step is taken on it and the
fragment's parameters become MIX * theirs + (1 - MIX) * the new outer copy, keeping half of what the
group learnt in those tau steps (the paper's alpha = 0.5). A checkpoint first applies every transfer
in flight, so a resumed run continues as the saved one did. A quantized (int8, fp4) pseudo-gradient's
all-to-all runs when the fragment is applied, so it is not overlapped.

Params and outer copies are this rank's local shards: every group shards the same way over its
dp_shard (and tp, pp) ranks, so the rank at the same coordinate in each group holds the same slice.
The outer copy and the momentum keep the parameters' DTensor placements, so the run's DCP
checkpoint saves them once per slice (checkpoint/state.py, keys diloco.outer.* and
diloco.momentum.*). Between outer steps the groups' parameters and inner optimizer states differ,
so each group's own copy is saved too (diloco.replica<g>.model.*, .optim.*) and a resumed run
continues every group from where it was.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from shoal.model.transformer import param_name
from shoal.parallel.compression import CODECS, quantized_mean_

MIX = 0.5
"""Overlapped outer steps keep this share of the group's own parameters (Douillard et al. 2025, alpha)."""


def due_fragments(step: int, inner_steps: int, fragments: int) -> list[int]:
    """Fragments whose outer step falls after optimizer step `step` (1-based): j at step % H == j*H//F."""
    return [j for j in range(fragments) if step % inner_steps == j * inner_steps // fragments]


def split_fragments(sizes: list[int], fragments: int) -> list[int]:
    """The fragment of each parameter: consecutive parameters (model order: embedding, blocks, head)
    cut where the running size crosses k/F of the total, so fragments are contiguous layers of about
    equal size."""
    total, seen, out = max(1, sum(sizes)), 0, []
    for n in sizes:
        out.append(min(fragments - 1, seen * fragments // total))
        seen += n
    return out


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


class DiLoCo:
    """The outer optimizer of one rank: `after_step(step, last)` after each inner optimizer step."""

    def __init__(self, modules, group, parallel_cfg, replica: int):
        self.group, self.groups, self.replica = group, dist.get_world_size(group), replica
        self.inner_steps, self.lr = parallel_cfg.diloco_inner_steps, parallel_cfg.diloco_outer_lr
        self.mu, self.quantize = parallel_cfg.diloco_outer_momentum, parallel_cfg.diloco_quantize
        self.fragments = parallel_cfg.diloco_fragments
        self.overlap = parallel_cfg.diloco_overlap_steps
        self.in_flight: list[tuple[int, list[str], object]] = []  # (apply after step, names, finish)
        self.params = {param_name(n): p for m in modules for n, p in _unwrapped(m).named_parameters()}
        with torch.no_grad():
            self.outer = {n: p.detach().clone() for n, p in self.params.items()}
            self.buf = {n: torch.zeros_like(p) for n, p in self.params.items()}
        names = list(self.params)
        where = split_fragments([_local(self.params[n]).numel() for n in names], self.fragments)
        self.fragment_names = [[n for n, f in zip(names, where) if f == j] for j in range(self.fragments)]

    def after_step(self, step: int, last: bool) -> None:
        landed = [f for f in self.in_flight if f[0] <= step or last]
        self.finish_in_flight(landed)
        due = range(self.fragments) if last else due_fragments(step, self.inner_steps, self.fragments)
        names = [self.fragment_names[j] for j in due if self.fragment_names[j]]
        if names and self.overlap and not last:  # the run's last step ends on one model: no overlap there
            self.in_flight += [(step + self.overlap, ns, self._send(ns)) for ns in names]
        elif names:
            self.sync(names, final=last)

    @torch.no_grad()
    def finish_in_flight(self, which: list | None = None) -> None:
        """Outer steps for transfers in flight (all of them by default: before a checkpoint), in the
        order they were sent, which is the same on every group."""
        for item in list(self.in_flight) if which is None else which:
            self.in_flight.remove(item)
            _, names, finish = item
            self._apply(names, finish(), mix=MIX)

    @torch.no_grad()
    def sync(self, fragments: list[list[str]], final: bool = False) -> None:
        """Outer steps for these fragments: every all-reduce issued first, each waited before its
        fragment is applied. `final`: the run's last step, which lands on the groups' mean."""
        pending = [(names, self._send(names)) for names in fragments]
        for names, finish in pending:
            self._apply(names, finish(), mix=0.0, final=final)

    def _apply(self, names: list[str], mean: torch.Tensor, mix: float, final: bool = False) -> None:
        """The outer step on these parameters' averaged pseudo-gradient; the parameters become
        mix * theirs + (1 - mix) * the new outer copy. `final` lands on the groups' plain mean
        (outer lr 1, no momentum): the model a run ends with is the one its groups agree on, not a
        step past it along the momentum (plain mean vs a last Nesterov step: better on all 9
        method/seed pairs of bench_diloco.py, by 0.1-0.5 points of eval loss, docs/slow_links.md)."""
        for n, d in zip(names, mean.split([_local(self.outer[n]).numel() for n in names])):
            outer, buf = _local(self.outer[n]), _local(self.buf[n])
            d = d.view_as(outer)
            if final:
                outer.sub_(d)
                _local(self.params[n]).copy_(outer)
                continue
            if self.mu:
                buf.mul_(self.mu).add_(d)
                d = d.add(buf, alpha=self.mu)  # Nesterov: look ahead along the momentum
            outer.sub_(d, alpha=self.lr)
            param = _local(self.params[n])
            if mix:
                param.mul_(mix).add_(outer, alpha=1 - mix)
            else:
                param.copy_(outer)

    def _send(self, names: list[str]):
        """Start averaging this fragment's pseudo-gradient over the groups; the function it returns
        waits and returns the mean in fp32."""
        flat = torch.cat([(_local(self.outer[n]) - _local(self.params[n])).view(-1) for n in names])
        if self.quantize in CODECS:
            return lambda: quantized_mean_(flat, self.group, self.quantize)
        wire = flat.div_(self.groups).to(torch.bfloat16) if self.quantize == "bf16" else flat.div_(self.groups)
        work = dist.all_reduce(wire, group=self.group, async_op=True)

        def finish():
            work.wait()
            return wire.float() if wire is not flat else flat
        return finish

    # Checkpoint (checkpoint/state.py calls these; keys go under "diloco.")

    def capture(self, model: dict, optim: dict) -> dict:
        self.finish_in_flight()  # model and optim hold the live tensors: they are saved as updated here
        g = self.replica
        return ({f"outer.{n}": t for n, t in self.outer.items()} | {f"momentum.{n}": t for n, t in self.buf.items()}
                | {f"replica{g}.model.{k}": v for k, v in model.items()}
                | {f"replica{g}.optim.{k}": v for k, v in optim.items()})

    def load_targets(self, model: dict, optim: dict, saved_keys) -> tuple[dict, dict, dict]:
        """(model, optim, diloco) targets: this group's own copy of the model and optimizer state when
        the checkpoint has it (read into the same tensors), and the outer state when it has that."""
        g, targets = self.replica, {}
        if any(k.startswith(f"diloco.replica{g}.") for k in saved_keys):
            targets = {f"replica{g}.model.{k}": v for k, v in model.items()} | {
                f"replica{g}.optim.{k}": v for k, v in optim.items() if f"diloco.replica{g}.optim.{k}" in saved_keys}
            model, optim = {}, {}
        if all(f"diloco.outer.{n}" in saved_keys for n in self.outer):
            targets |= {f"outer.{n}": t for n, t in self.outer.items()} | {f"momentum.{n}": t for n, t in self.buf.items()}
        return model, optim, targets

    def take_replica(self, loaded: dict) -> None:
        """Move this group's own model and optimizer state (if read) to where apply() expects them."""
        prefix = f"replica{self.replica}."
        own = {k.removeprefix(prefix): v for k, v in loaded.get("diloco", {}).items() if k.startswith(prefix)}
        if own:
            loaded["model"] = {k.removeprefix("model."): v for k, v in own.items() if k.startswith("model.")}
            loaded["optim"] = {k.removeprefix("optim."): v for k, v in own.items() if k.startswith("optim.")}

    @torch.no_grad()
    def after_load(self, loaded: dict) -> None:
        """A checkpoint without outer state (saved without DiLoCo) starts the outer copy from the
        loaded parameters, with no momentum."""
        if not any(k.startswith("outer.") for k in loaded.get("diloco", {})):
            for n, p in self.params.items():
                _local(self.outer[n]).copy_(_local(p))
                _local(self.buf[n]).zero_()


def _unwrapped(module):
    return module.module if isinstance(module, torch.nn.parallel.DistributedDataParallel) else module
