"""Context parallelism: each sequence split across the cp ranks, attention exact over all of it.

The split, balanced for causal attention: a sequence of T tokens is cut into 2*cp chunks of
c = T / (2*cp) tokens, and cp rank i holds chunks i and 2*cp-1-i, a front and a back one
([B, 2c] in that order). A query chunk a sees key chunks 0..a, so rank i computes (i+1) +
(2*cp-i) = 2*cp+1 chunk pairs, the same on every rank (Megatron-Core's and torchtitan's order).

    T = 8 tokens, cp = 2:   chunks 0 1 2 3   rank 0 holds 0 and 3, rank 1 holds 1 and 2

Per layer (_AttentionOverChunks, a custom autograd function):
- forward: the ranks' keys and values are all-gathered over the cp group (Llama 3 trained its
  128K stage this way: under GQA the keys and values are small beside the queries), and each
  local query chunk attends to the keys it can see. On CPU that is one or two calls of SDPA's
  fused flash-style kernel per query chunk (the earlier chunks unmasked and its own chunk causal,
  or one call with the document/window mask), merged with their log-sum-exps
  (`fused_forward`). Elsewhere it is the reference, `chunk_forward`: one chunk pair at a time in
  plain math, merged the same way (flash attention's online softmax); only [c, c] score blocks
  exist, and the diagonal pair goes first, so the running log-sum-exp is finite from the start.
- backward: the keys and values are gathered again (nothing of the other ranks' is kept between
  forward and backward), each call's (or pair's) probabilities are recomputed from the merged
  output and log-sum-exp, and the keys' and values' gradients, summed over every rank's queries,
  are reduce-scattered back to the ranks that own them.
The four functions are the math alone, collective-free, so a test runs every rank in one process
against whole-sequence attention (tests/unit/test_context_parallel.py).

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


def visible(a: int, keys: slice, c: int, documents_BT: torch.Tensor | None, window: int, device) -> torch.Tensor:
    """Which keys (global positions `keys`) the queries of chunk a see, [B or 1, 1, c, len(keys)]:
    causal, within the sliding window, within the document."""
    q_pos, k_pos = torch.arange(a * c, (a + 1) * c, device=device), torch.arange(keys.start, keys.stop, device=device)
    offset = q_pos[:, None] - k_pos[None, :]
    allowed = offset >= 0
    if window:
        allowed = allowed & (offset < window)
    if documents_BT is None:
        return allowed[None, None]
    return (allowed & (documents_BT[:, q_pos, None] == documents_BT[:, None, k_pos]))[:, None]


def chunk_mask(a: int, b: int, c: int, documents_BT, window: int, device):
    """Which keys of chunk b the queries of chunk a see: None (all of them), False (none), or
    `visible`'s mask [B or 1, 1, c, c]."""
    if documents_BT is None and not window and b != a:
        return None if b < a else False
    allowed = visible(a, slice(b * c, (b + 1) * c), c, documents_BT, window, device)
    return allowed if bool(allowed.any()) else False


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


def chunk_forward(q_BHTE, k_BHTE, v_BHTE, rank: int, cp: int, documents_BT, window: int, scale: float):
    """The reference: this rank's attention output [B, H, 2c, E] and log-sum-exp [B, H, 2c, 1],
    chunk pair by chunk pair in plain PyTorch math. q: this rank's queries; k, v: the whole
    sequence's keys and values in global order [B, H, T, E] (GQA heads already repeated)."""
    c = q_BHTE.shape[2] // 2
    out, lse = [None, None], [None, None]
    for half, a, b, mask in visible_pairs(rank, cp, c, documents_BT, window, q_BHTE.device):
        k, v = k_BHTE[:, :, b * c:(b + 1) * c], v_BHTE[:, :, b * c:(b + 1) * c]
        s_BHcc = scores(q_BHTE[:, :, half * c:(half + 1) * c], k, mask, scale)
        block_lse = s_BHcc.logsumexp(-1, keepdim=True)
        if out[half] is None:  # the diagonal pair
            lse[half], out[half] = block_lse, torch.exp(s_BHcc - block_lse) @ v
        else:
            merged = torch.logaddexp(lse[half], block_lse)
            out[half] = out[half] * torch.exp(lse[half] - merged) + torch.exp(s_BHcc - merged) @ v
            lse[half] = merged
    return torch.cat(out, 2), torch.cat(lse, 2)


def chunk_backward(q_BHTE, k_BHTE, v_BHTE, out_BHTE, lse_BHT1, dout_BHTE, rank: int, cp: int, documents_BT,
                   window: int, scale: float):
    """Gradients of chunk_forward: dq [B, H, 2c, E], and dk, dv [B, H, T, E] from this rank's
    queries (the ranks' sum is the keys' and values' gradient)."""
    c = q_BHTE.shape[2] // 2
    dq, dk, dv = torch.zeros_like(q_BHTE), torch.zeros_like(k_BHTE), torch.zeros_like(v_BHTE)
    delta_BHT1 = (dout_BHTE * out_BHTE).sum(-1, keepdim=True)
    for half, a, b, mask in visible_pairs(rank, cp, c, documents_BT, window, q_BHTE.device):
        rows, keys = slice(half * c, (half + 1) * c), slice(b * c, (b + 1) * c)
        q, dout, k, v = q_BHTE[:, :, rows], dout_BHTE[:, :, rows], k_BHTE[:, :, keys], v_BHTE[:, :, keys]
        p_BHcc = torch.exp(scores(q, k, mask, scale) - lse_BHT1[:, :, rows])
        ds_BHcc = p_BHcc * (dout @ v.transpose(-1, -2) - delta_BHT1[:, :, rows])
        dq[:, :, rows] += (ds_BHcc @ k) * scale
        dk[:, :, keys] += (ds_BHcc.transpose(-1, -2) @ q) * scale
        dv[:, :, keys] += p_BHcc.transpose(-1, -2) @ dout
    return dq, dk, dv


def fused_calls(a: int, c: int, documents_BT, window: int, dtype, device) -> list[tuple[slice, bool, object]]:
    """The fused kernel's calls for query chunk a: (keys, causal, additive mask). Causal alone: the
    chunks before a, unmasked, and a itself, causal (no mask in memory). With documents or a window:
    one call over keys 0..(a+1)c with the mask, the diagonal included, so no row is empty (the
    kernel returns 0, not -inf, for a row that sees nothing)."""
    if documents_BT is None and not window:
        return [(slice(a * c, (a + 1) * c), True, None)] + ([(slice(0, a * c), False, None)] if a else [])
    keys = slice(0, (a + 1) * c)
    allowed = visible(a, keys, c, documents_BT, window, device)
    return [(keys, False, torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, -math.inf))]


_FLASH_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_FLASH_CPU_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def fused_forward(q_BHTE, k_BHTE, v_BHTE, rank: int, cp: int, documents_BT, window: int, scale: float):
    """chunk_forward through SDPA's fused CPU kernel (flash-style, which returns its log-sum-exp):
    one or two calls per query chunk, merged by log-sum-exp. 3-4x the reference's speed on CPU."""
    c = q_BHTE.shape[2] // 2
    outs, lses = [], []
    for half, a in enumerate(query_chunks(rank, cp)):
        q = q_BHTE[:, :, half * c:(half + 1) * c]
        parts = [_FLASH_CPU(q, k_BHTE[:, :, keys], v_BHTE[:, :, keys], 0.0, causal, attn_mask=mask, scale=scale)
                 for keys, causal, mask in fused_calls(a, c, documents_BT, window, q.dtype, q.device)]
        lse = torch.stack([l for _, l in parts]).logsumexp(0)  # [B, H, c]
        outs.append(sum(o * torch.exp(l - lse)[..., None] for o, l in parts))
        lses.append(lse[..., None])
    return torch.cat(outs, 2), torch.cat(lses, 2)


def fused_backward(q_BHTE, k_BHTE, v_BHTE, out_BHTE, lse_BHT1, dout_BHTE, rank: int, cp: int, documents_BT,
                   window: int, scale: float):
    """chunk_backward through the fused kernel's backward: each call given the merged output and
    log-sum-exp, so its probabilities are the merged attention's (as ring attention does)."""
    c = q_BHTE.shape[2] // 2
    dq, dk, dv = torch.zeros_like(q_BHTE), torch.zeros_like(k_BHTE), torch.zeros_like(v_BHTE)
    for half, a in enumerate(query_chunks(rank, cp)):
        rows = slice(half * c, (half + 1) * c)
        q, out, dout = q_BHTE[:, :, rows], out_BHTE[:, :, rows], dout_BHTE[:, :, rows].contiguous()
        lse = lse_BHT1[:, :, rows, 0].contiguous()
        for keys, causal, mask in fused_calls(a, c, documents_BT, window, q.dtype, q.device):
            gq, gk, gv = _FLASH_CPU_BACKWARD(dout, q, k_BHTE[:, :, keys], v_BHTE[:, :, keys], out, lse, 0.0, causal,
                                             attn_mask=mask, scale=scale)
            dq[:, :, rows] += gq
            dk[:, :, keys] += gk
            dv[:, :, keys] += gv
    return dq, dk, dv


class _AttentionOverChunks(torch.autograd.Function):
    """q [B, H, 2c, E], k and v [B, K, 2c, E] of this rank's chunks -> attention output [B, H, 2c, E].
    On CPU through SDPA's fused kernel, elsewhere through the reference math (CUDA's fused kernels
    take other arguments; not wired yet)."""

    @staticmethod
    def forward(ctx, q, k, v, documents_BT, cp: "ContextParallel", window: int):
        scale = 1.0 / math.sqrt(q.shape[-1])
        attend = fused_forward if q.device.type == "cpu" else chunk_forward
        with torch.autocast(q.device.type, enabled=False):  # fp32 (or float64) softmax math, as SDPA's
            k_all, v_all = cp.gather_kv(k, v, q.shape[1])
            out, lse = attend(upcast(q), k_all, v_all, cp.rank, cp.cp, documents_BT, window, scale)
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
        backward = fused_backward if q.device.type == "cpu" else chunk_backward
        with torch.autocast(q.device.type, enabled=False):
            k_all, v_all = cp.gather_kv(k, v, q.shape[1])  # again: nothing of the other ranks' was kept
            dq, dk_all, dv_all = backward(upcast(q), k_all, v_all, out, lse, upcast(dout), cp.rank, cp.cp,
                                          documents_BT, ctx.window, ctx.scale)
        dk, dv = cp.reduce_scatter_kv(dk_all, dv_all, k.shape[1])
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
        """Every rank's keys and values (one all-gather), in global order and with each kv head
        repeated for its query heads: k, v [B, H, T, E] in fp32 or wider."""
        local = torch.stack([k_BKTE, v_BKTE]).contiguous()  # [2, B, K, 2c, E]
        everyone = local.new_empty((self.cp * 2, *local.shape[1:]))  # gloo wants the ranks along dim 0
        all_gather_single(everyone, local, group=self.group)
        everyone = upcast(everyone.unflatten(0, (self.cp, 2)))
        c = k_BKTE.shape[2] // 2
        chunks = [everyone[r, :, :, :, h * c:(h + 1) * c] for r, h in (chunk_owner(j, self.cp) for j in range(2 * self.cp))]
        kv_2BKTE = torch.cat(chunks, -2)
        return kv_2BKTE.repeat_interleave(n_heads // k_BKTE.shape[1], dim=2).unbind(0)

    def reduce_scatter_kv(self, dk_BHTE, dv_BHTE, n_kv_heads: int):
        """The keys' and values' gradients [B, H, T, E] from this rank's queries, summed over the cp
        group onto the ranks that own each chunk: dk, dv [B, K, 2c, E]."""
        B, H, T, E = dk_BHTE.shape
        c = T // (2 * self.cp)
        both = torch.stack([dk_BHTE, dv_BHTE]).unflatten(2, (n_kv_heads, -1)).sum(3)  # [2, B, K, T, E]
        owners = both.new_empty((self.cp, 2, B, n_kv_heads, 2 * c, E))  # each rank's two chunks, in its order
        for j in range(2 * self.cp):
            r, h = chunk_owner(j, self.cp)
            owners[r, :, :, :, h * c:(h + 1) * c] = both[:, :, :, j * c:(j + 1) * c]
        mine = owners.new_empty(owners.shape[1:])
        reduce_scatter_single(mine, owners.flatten(0, 1), group=self.group)
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
