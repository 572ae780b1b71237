"""Compressed gradient reduction under FSDP2 (zero 2/3), through FSDP2's own two doors.

HSDP shards within dp_shard (inside a node) and replicates across dp_replicate (across nodes, the
slow link). FSDP2's native HSDP all-reduces each unit's gradient shard across replicas in fp32,
with no way to change what it sends. So with int8/topk/powersgd the model is sharded on the 1-D
dp_shard mesh only (FSDP2 then does not know about replicas and all-reduces nothing), and:

* `set_all_reduce_hook`: after each unit's reduce-scatter, the compressor averages the unit's flat
  gradient shard (mean over dp_shard already) across dp_replicate, in place: the DDP comm hooks'
  methods, on shards. Every replica gets the same values, so replicas stay identical.
* `set_custom_reduce_scatter`: the reduce-scatter within dp_shard goes through `ReduceScatter`
  below, in int8 (quantize -> all-to-all -> sum in fp32: one quantization, no ring to accumulate
  error) for int8, plain fp32 otherwise; both count their bytes as gradient bytes.

Compressor state is keyed by parameter name (FSDP's fully qualified name) and holds this rank's
shard, in the flat buffer's padded shard shape; the checkpoint keeps it per rank.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as FSDPReduceScatter

from shoal.comm import ops
from shoal.comm.counter import CommCounter
from shoal.comm.renamed import reduce_scatter_single
from shoal.model.transformer import param_name
from shoal.parallel.compression import CHUNK, Compressor, Segment, dequantize, quantize


def attach(units: list[nn.Module], compressor: Compressor, int8_reduce_scatter: bool) -> None:
    """Route every FSDP unit's gradient reduction through `compressor` (units: the fully_shard'ed
    modules of one rank). The compressor counts a step when all units have reduced once."""
    done = [0]

    def hook_for(unit: nn.Module):
        def hook(shard: torch.Tensor) -> None:
            done[0] += 1
            last = done[0] % len(units) == 0
            if compressor.world == 1:  # no replicas to average over (pure FSDP with int8)
                compressor.step += int(last)
                return
            out = compressor.reduce_counted(shard, segments(unit), last=last)
            assert out is shard  # FSDP reads the result from the buffer it passed in
        return hook

    for unit in units:
        unit.set_all_reduce_hook(hook_for(unit))
        unit.set_custom_reduce_scatter(ReduceScatter(compressor, int8_reduce_scatter))


def segments(unit: nn.Module) -> list[Segment]:
    """The layout of the unit's flat gradient shard: each parameter's padded shard, in order (as
    FSDP2's foreach_reduce lays it out; its padding rows are zeros)."""
    state = unit._get_fsdp_state()
    # torch 2.13 holds a list of groups (one here: set_all_reduce_hook demands it); 2.11 held one group
    groups = getattr(state, "_fsdp_param_groups", None)
    (group,) = groups if groups is not None else [state._fsdp_param_group]
    return [(param_name(p._param_fqn), p.padded_sharded_param_size) for p in group.fsdp_params]


class ReduceScatter(FSDPReduceScatter):
    """FSDP2's reduce-scatter, in int8 or plain, counted as gradient bytes of `compressor`."""

    def __init__(self, compressor: Compressor, int8: bool):
        self.compressor, self.int8 = compressor, int8

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        assert op in (dist.ReduceOp.AVG, dist.ReduceOp.SUM), op  # fp32/bf16 reduce, no divide factor set
        p = group.size()
        self.compressor.plain += int(ops.wire_bytes("reduce_scatter", input_tensor.numel() * input_tensor.element_size(), p))
        with CommCounter() as c:
            if self.int8:
                int8_reduce_scatter(output_tensor, input_tensor, group, average=op == dist.ReduceOp.AVG)
            else:
                reduce_scatter_single(output_tensor, input_tensor, op=op, group=group)
        self.compressor.sent += sum(c.bytes.values())
        return None  # done: nothing to wait for


def int8_reduce_scatter(out: torch.Tensor, x: torch.Tensor, group, average: bool) -> None:
    """out = (mean or sum over ranks of x)'s slice for this rank, with each value sent once in int8
    (per-CHUNK fp32 scales): rank j gets every rank's quantized slice j and sums them in fp32."""
    p, n = group.size(), out.numel()
    per_rank = math.ceil(n / CHUNK) * CHUNK
    padded = x.new_zeros(p, per_rank)
    padded[:, :n] = x.view(p, n)
    q, scale = quantize(padded.view(-1))
    q_in, s_in = torch.empty_like(q), torch.empty_like(scale)
    dist.all_to_all_single(q_in, q, group=group)
    dist.all_to_all_single(s_in, scale, group=group)
    total = dequantize(q_in, s_in).view(p, per_rank).sum(0)[:n]
    out.copy_(total.div_(p) if average else total)

