"""Sampling text from a trained model (no KV cache: the tiny models here re-run the prefix)."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from shoal.model.transformer import Transformer


@torch.no_grad()
def generate_ids(model: Transformer, prompt_ids: list[int], n_tokens: int, *, temperature: float = 0.8,
                 top_k: int = 40, seed: int = 0, stop_id: int | None = None) -> Iterator[int]:
    """Yield up to n_tokens new token ids, one at a time as each is sampled."""
    assert prompt_ids and temperature >= 0 and top_k >= 0, "callers check the user's values"
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    ids = torch.tensor([prompt_ids], device=device)
    for _ in range(n_tokens):
        logits = model(ids[:, -model.cfg.max_seq_len:])[0, -1].float()
        if temperature <= 0:
            next_id = int(logits.argmax())
        else:
            if top_k:
                kth = logits.topk(min(top_k, logits.numel())).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            # float64 and the best logit at 0: 1e-300 is near-greedy and 1e300 near-uniform, never NaN
            probs = torch.softmax((logits.double() - logits.max()) / temperature, dim=-1)
            next_id = int(torch.multinomial(probs, 1, generator=generator))
        if next_id == stop_id:
            return
        yield next_id
        ids = torch.cat([ids, torch.tensor([[next_id]], device=device)], dim=1)


def sample(model: Transformer, prompt_ids: list[int], n_tokens: int, **kwargs) -> list[int]:
    """All of generate_ids at once."""
    return list(generate_ids(model, prompt_ids, n_tokens, **kwargs))


def stream_text(model: Transformer, tokenizer, prompt_ids: list[int], n_tokens: int, **kwargs) -> Iterator[str]:
    """The generated text in pieces, as tokens are made.

    A token may end inside a multi-byte character (byte tokenizer) or a merge may change earlier
    text, so each piece is the new tail of the decoded text, held back while it ends in U+FFFD
    (an incomplete character that the next token may complete).
    """
    ids: list[int] = []
    shown = 0
    for next_id in generate_ids(model, prompt_ids, n_tokens, stop_id=tokenizer.eos_id, **kwargs):
        ids.append(next_id)
        text = tokenizer.decode(ids)
        if not text.endswith("\ufffd") and len(text) > shown:
            yield text[shown:]
            shown = len(text)
    text = tokenizer.decode(ids)
    if len(text) > shown:
        yield text[shown:]
