"""Context parallelism: each sequence split across the cp ranks, attention exact over all of it.

The split, balanced for causal attention: a sequence of T tokens is cut into 2*cp chunks of
c = T / (2*cp) tokens, and cp rank i holds chunks i and 2*cp-1-i, a front and a back one
([B, 2c] in that order). A query chunk a sees key chunks 0..a, so rank i computes (i+1) +
(2*cp-i) = 2*cp+1 chunk pairs, the same on every rank (Megatron-Core's and torchtitan's order).

    T = 8 tokens, cp = 2:   chunks 0 1 2 3   rank 0 holds 0 and 3, rank 1 holds 1 and 2

Per layer (attention_over_chunks):
- forward: the ranks' keys and values are all-gathered over the cp group (Llama 3 trained its
  128K stage this way: KV is small beside Q under GQA), and each local query chunk attends to
  the key chunks it can see, one chunk pair at a time, merged with log-sum-exp (flash-attention's
  online softmax). No [T, T] score matrix exists, only [c, c] ones; the diagonal pair goes first,
  so the running log-sum-exp is finite from the start (every query sees itself).
- backward: the keys and values are gathered again (nothing of the other ranks' is kept between
  forward and backward), each pair's probabilities are recomputed from the saved log-sum-exp,
  and the keys' and values' gradients, summed over every rank's queries, are reduce-scattered
  back to the ranks that own them.
`chunk_forward` and `chunk_backward` are the math alone, collective-free, so a test runs every
rank in one process against plain attention (tests/unit/test_context_parallel.py).

What else changes under cp (everything else is the single-device model):
- rotary positions are the tokens' global positions (this rank's chunks), or with document masks
  their offsets in their documents, computed from the whole sequence's documents tensor, which
  the model gets whole (the layers' mask slot carries it to the attention);
- the loss: each rank's sum over its tokens, times cp over the sequence's count of targets, so
  the gradient mean over dp x cp (the data-parallel wrapper reduces over both: cp ranks hold the
  same parameters) is one process's mean; without ignored targets the scale is exactly 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from shoal.comm.renamed import all_gather_single, reduce_scatter_single
from shoal.model.precision import upcast
from shoal.model.transformer import IGNORE, cross_entropy, document_positions


def query_chunks(rank: int, cp: int) -> tuple[int, int]:
    """The global chunks cp rank `rank` holds, in its local order: a front one and a back one."""
    return rank, 2 * cp - 1 - rank


def chunk_owner(j: int, cp: int) -> tuple[int, int]:
    """(rank, half) that holds global chunk j: its rank, and 0 (front) or 1 (back) in that rank's tokens."""
    return (j, 0) if j < cp else (2 * cp - 1 - j, 1)


def local_positions(rank: int, cp: int, seq_len: int, device=None) -> torch.Tensor:
    """The global positions of this rank's tokens [2c]."""
    c = seq_len // (2 * cp)
    return torch.cat([torch.arange(a * c, (a + 1) * c, device=device) for a in query_chunks(rank, cp)])


def split_sequence(x_BT: torch.Tensor, rank: int, cp: int) -> torch.Tensor:
    """This rank's tokens (or targets) of whole sequences [B, T] -> [B, 2c]."""
    B, T = x_BT.shape
    return x_BT.view(B, 2 * cp, T // (2 * cp))[:, list(query_chunks(rank, cp))].reshape(B, T // cp)


def chunk_mask(a: int, b: int, c: int, documents_BT: torch.Tensor | None, window: int, device):
    """Which keys of chunk b the queries of chunk a see: None (all of them), False (none), or a
    boolean mask [B or 1, 1, c, c]: causal, within the sliding window, within the document."""
    if documents_BT is None and not window:
        if b != a:
            return None if b < a else False
    i = torch.arange(c, device=device)
    offset_cc = (a - b) * c + i[:, None] - i[None, :]  # query position - key position
    allowed = offset_cc >= 0
    if window:
        allowed = allowed & (offset_cc < window)
    if documents_BT is not None:
        q_doc, k_doc = documents_BT[:, a * c:(a + 1) * c], documents_BT[:, b * c:(b + 1) * c]
        allowed_B1cc = (allowed & (q_doc[:, :, None] == k_doc[:, None, :]))[:, None]
    else:
        allowed_B1cc = allowed[None, None]
    return allowed_B1cc if bool(allowed_B1cc.any()) else False


def key_order(a: int, cp: int) -> list[int]:
    """The key chunks query chunk a visits: its own first (see the module docstring), then the others."""
    return [a] + [b for b in range(2 * cp) if b != a]


def visible_pairs(rank: int, cp: int, c: int, documents_BT, window: int, device):
    """(half, a, b, mask) for each chunk pair this rank computes: query chunk a (its `half` of the
    rank's tokens) and key chunk b, the diagonal first for each a; pairs with nothing visible are left out."""
    for half, a in enumerate(query_chunks(rank, cp)):
        for b in key_order(a, cp):
            mask = chunk_mask(a, b, c, documents_BT, window, device)
            if mask is not False:
                yield half, a, b, mask


def scores(q_BHcE, k_BHcE, mask, scale: float) -> torch.Tensor:
    s_BHcc = (q_BHcE @ k_BHcE.transpose(-1, -2)) * scale
    return s_BHcc if mask is None else s_BHcc.masked_fill(~mask, -math.inf)


def chunk_forward(q_BHTE, kv, rank: int, cp: int, documents_BT, window: int, scale: float):
    """This rank's attention output [B, H, 2c, E] and log-sum-exp [B, H, 2c, 1], in q's dtype.
    `kv(j)` gives global chunk j's keys and values, each [B, H, c, E] (GQA heads already repeated)."""
    c = q_BHTE.shape[2] // 2
    out, lse = [None, None], [None, None]
    for half, a, b, mask in visible_pairs(rank, cp, c, documents_BT, window, q_BHTE.device):
        k, v = kv(b)
        s_BHcc = scores(q_BHTE[:, :, half * c:(half + 1) * c], k, mask, scale)
        block_lse = s_BHcc.logsumexp(-1, keepdim=True)
        if out[half] is None:  # the diagonal pair
            lse[half], out[half] = block_lse, torch.exp(s_BHcc - block_lse) @ v
        else:
            merged = torch.logaddexp(lse[half], block_lse)
            out[half] = out[half] * torch.exp(lse[half] - merged) + torch.exp(s_BHcc - merged) @ v
            lse[half] = merged
    return torch.cat(out, 2), torch.cat(lse, 2)


def chunk_backward(q_BHTE, out_BHTE, lse_BHT1, dout_BHTE, kv, rank: int, cp: int, documents_BT, window: int,
                   scale: float):
    """Gradients of chunk_forward: dq [B, H, 2c, E], and {chunk j: [dk, dv]} [B, H, c, E] for the
    key chunks this rank's queries saw (the owners sum them over the ranks)."""
    c = q_BHTE.shape[2] // 2
    dq = torch.zeros_like(q_BHTE)
    dkv: dict[int, list[torch.Tensor]] = {}
    delta_BHT1 = (dout_BHTE * out_BHTE).sum(-1, keepdim=True)
    for half, a, b, mask in visible_pairs(rank, cp, c, documents_BT, window, q_BHTE.device):
        rows = slice(half * c, (half + 1) * c)
        q, dout = q_BHTE[:, :, rows], dout_BHTE[:, :, rows]
        k, v = kv(b)
        p_BHcc = torch.exp(scores(q, k, mask, scale) - lse_BHT1[:, :, rows])
        ds_BHcc = p_BHcc * (dout @ v.transpose(-1, -2) - delta_BHT1[:, :, rows])
        dq[:, :, rows] += (ds_BHcc @ k) * scale
        dk, dv = (ds_BHcc.transpose(-1, -2) @ q) * scale, p_BHcc.transpose(-1, -2) @ dout
        if b in dkv:
            dkv[b][0] += dk
            dkv[b][1] += dv
        else:
            dkv[b] = [dk, dv]
    return dq, dkv


class _AttentionOverChunks(torch.autograd.Function):
    """q [B, H, 2c, E], k and v [B, K, 2c, E] of this rank's chunks -> attention output [B, H, 2c, E]."""

    @staticmethod
    def forward(ctx, q, k, v, documents_BT, cp: "ContextParallel", window: int):
        scale = 1.0 / math.sqrt(q.shape[-1])
        kv = cp.gather_kv(k, v, q.shape[1])
        with torch.autocast(q.device.type, enabled=False):  # fp32 (or float64) softmax math, as SDPA's
            out, lse = chunk_forward(upcast(q), kv, cp.rank, cp.cp, documents_BT, window, scale)
        # Laid out [B, T, H, E] in memory, as SDPA's fused CPU kernel returns it: the layer's
        # transpose and reshape to [B, T, D] for wo is then a view, not a second saved copy.
        out = out.transpose(1, 2).contiguous().transpose(1, 2)
        ctx.save_for_backward(q, k, v, out, lse, documents_BT)
        ctx.cp, ctx.window, ctx.scale = cp, window, scale
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, documents_BT = ctx.saved_tensors
        cp = ctx.cp
        kv = cp.gather_kv(k, v, q.shape[1])
        with torch.autocast(q.device.type, enabled=False):
            dq, dkv = chunk_backward(upcast(q), out, lse, upcast(dout), kv, cp.rank, cp.cp, documents_BT, ctx.window,
                                     ctx.scale)
        dk, dv = cp.reduce_scatter_kv(dkv, k)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


@dataclass
class ContextParallel:
    """One rank's place in its cp group, and what it does with it: split batches, attend, scale the loss."""

    group: object
    rank: int
    cp: int
    seq_len: int

    def split(self, x_BT: torch.Tensor) -> torch.Tensor:
        return split_sequence(x_BT, self.rank, self.cp)

    def attention_inputs(self, model):
        """A stage's replacement for Transformer.attention_inputs: the rotary rows of this rank's
        global positions, and, in the layers' mask slot, the whole sequence's documents tensor (or None)."""
        def attention_inputs(documents_BT: torch.Tensor | None):
            positions = local_positions(self.rank, self.cp, self.seq_len, model.rope.device)
            if documents_BT is None:
                return model.rope[:, positions], None
            assert documents_BT.shape[1] == self.seq_len, (documents_BT.shape, self.seq_len)
            return model.rope[:, document_positions(documents_BT)[:, positions]], documents_BT
        return attention_inputs

    def attend(self, window: int):
        """A layer's replacement for Attention.attend."""
        window = 0 if window >= self.seq_len else window  # as wide as the sequence: plain causal

        def attend(q_BHTE, k_BKTE, v_BKTE, documents_BT):
            return _AttentionOverChunks.apply(q_BHTE, k_BKTE, v_BKTE, documents_BT, self, window)
        return attend

    def gather_kv(self, k_BKTE, v_BKTE, n_heads: int):
        """Every rank's keys and values (one all-gather); returns chunk j -> (k, v) [B, H, c, E] in fp32 or wider."""
        local = torch.stack([k_BKTE, v_BKTE]).contiguous()  # [2, B, K, 2c, E]
        everyone = local.new_empty((self.cp * 2, *local.shape[1:]))  # gloo wants the ranks along dim 0
        all_gather_single(everyone, local, group=self.group)
        everyone = upcast(everyone.unflatten(0, (self.cp, 2)))
        c, groups = k_BKTE.shape[2] // 2, n_heads // k_BKTE.shape[1]

        def kv(j: int):
            rank, half = chunk_owner(j, self.cp)
            k, v = everyone[rank, :, :, :, half * c:(half + 1) * c]
            return (k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)) if groups > 1 else (k, v)
        return kv

    def reduce_scatter_kv(self, dkv: dict, k_BKTE: torch.Tensor):
        """The keys' and values' gradients {chunk j: (dk, dv) [B, H, c, E]} from this rank's queries,
        summed over the cp group onto the ranks that own each chunk: (dk, dv) [B, K, 2c, E]."""
        B, K, T2, E = k_BKTE.shape
        c = T2 // 2
        dkv_all = torch.zeros((self.cp, 2, B, K, T2, E), dtype=upcast(k_BKTE).dtype, device=k_BKTE.device)
        for j, (dk, dv) in dkv.items():
            rank, half = chunk_owner(j, self.cp)
            both = torch.stack([dk, dv])  # [2, B, H, c, E] -> sum each kv head's query heads
            dkv_all[rank, :, :, :, half * c:(half + 1) * c] += both.unflatten(2, (K, -1)).sum(3)
        mine = dkv_all.new_empty(dkv_all.shape[1:])
        reduce_scatter_single(mine, dkv_all.flatten(0, 1), group=self.group)
        return mine[0], mine[1]

    def loss(self, logits_BTV: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
        """This rank's share of the sequences' mean loss, times cp (the data-parallel wrapper averages
        gradients over the cp ranks too): its sum over its targets * cp / the targets of all ranks."""
        counted = (targets_BT != IGNORE).sum().to(torch.get_default_dtype())
        total = counted.clone()
        dist.all_reduce(total, group=self.group)
        loss = cross_entropy(logits_BTV, targets_BT)  # mean over this rank's counted targets
        if float(total) == 0:
            return loss
        return loss * float(counted * self.cp / total)


def apply_context_parallel(model, cp_mesh, seq_len: int) -> ContextParallel:
    """Make a model (or pipeline stage) attend across the cp group; returns the split for its batches."""
    cp = ContextParallel(cp_mesh.get_group(), cp_mesh.get_local_rank(), cp_mesh.size(), seq_len)
    model.attention_inputs = cp.attention_inputs(model)
    for block in model.layers.values():
        block.attention.attend = cp.attend(block.attention.window)
    return cp
