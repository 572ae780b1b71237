"""Context parallelism's attention against plain attention over the whole sequence: the reference
math and the fused-kernel path, every cp rank run in one process (both are collective-free), in
float64, with causal, sliding-window and document masks, GQA included. The collectives around them are checked
by `shoal verify`'s cp layouts (tests/dist/test_parity.py)."""

import math

import pytest
import torch
import torch.nn.functional as F

from shoal.model.transformer import document_positions
from shoal.parallel.context_parallel import (chunk_backward, chunk_forward, chunk_owner, fused_backward,
                                             fused_forward, local_positions, query_chunks, split_sequence)


def reference(q, k, v, documents, window):
    T = q.shape[2]
    i = torch.arange(T)
    offset = i[:, None] - i[None, :]
    allowed = (offset >= 0) & ((offset < window) if window else True)
    mask = allowed[None, None] if documents is None else (allowed & (documents[:, :, None] == documents[:, None, :]))[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def documents_of(B, T, gen):
    starts = torch.rand(B, T, generator=gen) < 0.15
    starts[:, 0] = False
    return starts.cumsum(1)


@pytest.mark.parametrize("cp,window,docs", [(2, 0, False), (4, 0, False), (2, 0, True), (4, 5, True), (2, 6, False)])
def test_chunks_match_plain_attention(cp, window, docs):
    gen = torch.Generator().manual_seed(cp * 10 + window)
    B, H, K, T, E = 2, 4, 2, 8 * cp, 8
    q, k, v = (torch.randn(B, n, T, E, generator=gen, dtype=torch.float64, requires_grad=True) for n in (H, K, K))
    documents = documents_of(B, T, gen) if docs else None
    out = reference(q, k, v, documents, window)
    dout = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    dq_ref, dk_ref, dv_ref = torch.autograd.grad(out, (q, k, v), dout)

    c, scale = T // (2 * cp), 1 / math.sqrt(E)
    local = lambda x, r: torch.cat([x[:, :, a * c:(a + 1) * c] for a in query_chunks(r, cp)], 2)
    k_all, v_all = (x.detach().repeat_interleave(H // K, 1) for x in (k, v))
    for forward, backward in ((chunk_forward, chunk_backward), (fused_forward, fused_backward)):
        dk, dv = torch.zeros_like(k_all), torch.zeros_like(v_all)
        for rank in range(cp):
            q_r = local(q.detach(), rank)
            o_r, lse_r = forward(q_r, k_all, v_all, rank, cp, documents, window, scale)
            torch.testing.assert_close(o_r, local(out.detach(), rank), rtol=0, atol=1e-12)
            dq_r, dk_r, dv_r = backward(q_r, k_all, v_all, o_r, lse_r, local(dout, rank), rank, cp, documents, window,
                                        scale)
            torch.testing.assert_close(dq_r, local(dq_ref, rank), rtol=0, atol=1e-12)
            dk, dv = dk + dk_r, dv + dv_r
        torch.testing.assert_close(dk.unflatten(1, (K, -1)).sum(2), dk_ref, rtol=0, atol=1e-12)
        torch.testing.assert_close(dv.unflatten(1, (K, -1)).sum(2), dv_ref, rtol=0, atol=1e-12)


def test_split_positions_and_balance():
    cp, T = 4, 16
    x = torch.arange(T).repeat(2, 1)
    parts = [split_sequence(x, r, cp) for r in range(cp)]
    assert parts[1][0].tolist() == [2, 3, 12, 13]  # chunks 1 and 6
    assert sorted(torch.cat([p[0] for p in parts]).tolist()) == list(range(T))
    for r in range(cp):
        assert local_positions(r, cp, T).tolist() == parts[r][0].tolist()
        assert [chunk_owner(j, cp) for j in query_chunks(r, cp)] == [(r, 0), (r, 1)]
    # causal work: every rank computes 2*cp+1 chunk pairs
    assert {sum(a + 1 for a in query_chunks(r, cp)) for r in range(cp)} == {2 * cp + 1}
    docs = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2]])
    assert document_positions(docs).tolist() == [[0, 1, 2, 0, 1, 0, 1, 2]]
