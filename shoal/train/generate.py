"""Sampling text from a trained model (no KV cache: the tiny models here re-run the prefix)."""

from __future__ import annotations

import torch

from shoal.model.transformer import Transformer


@torch.no_grad()
def sample(model: Transformer, prompt_ids: list[int], n_tokens: int, *, temperature: float = 0.8,
           top_k: int = 40, seed: int = 0, stop_id: int | None = None) -> list[int]:
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    ids = torch.tensor([prompt_ids], device=device)
    out: list[int] = []
    for _ in range(n_tokens):
        logits = model(ids[:, -model.cfg.max_seq_len:])[0, -1].float()
        if temperature <= 0:
            next_id = int(logits.argmax())
        else:
            if top_k:
                kth = logits.topk(min(top_k, logits.numel())).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = torch.softmax(logits / temperature, dim=-1)
            next_id = int(torch.multinomial(probs, 1, generator=generator))
        if next_id == stop_id:
            break
        out.append(next_id)
        ids = torch.cat([ids, torch.tensor([[next_id]], device=device)], dim=1)
    return out
