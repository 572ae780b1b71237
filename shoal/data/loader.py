"""Deterministic, resumable token batches, sharded by data-parallel rank, from one corpus or a
weighted mixture of several.

Each corpus's token stream is cut into non-overlapping chunks of seq_len tokens; a training
sequence is the window of seq_len + 1 tokens starting at a chunk (inputs are its first seq_len
tokens, targets the last seq_len). A corpus's chunks are visited in a seeded random order
(permutation.py), a new one every epoch.

The global batch of step s is sequences [s*G, (s+1)*G) of that endless order. With a mixture,
each sequence is first given to a corpus by stride scheduling: the next sequence goes to the corpus
that is furthest behind its weight (the smallest (drawn + 1) / weight, ties to the first), so after
any number of sequences each corpus's share is within one sequence of its weight. It depends only
on (seed, step) and the corpora -- never on dp_size or micro_batch -- so one process and any number
of data-parallel ranks train on exactly the same global batch, which is what makes loss parity
between layouts testable. Rank r takes the r-th contiguous slice of G/dp_size sequences and cuts
it into micro-batches:

    global batch (G = 8, dp_size = 2, micro_batch = 2)
    [ s0 s1 s2 s3 | s4 s5 s6 s7 ]
      rank 0        rank 1
     [s0 s1][s2 s3] [s4 s5][s6 s7]   <- micro-batches, in order

The resumable state is the next step and how many sequences each corpus gave, so a run resumed
even on a different number of ranks continues with the next global batch instead of repeating one.

With document masks (`documents=eos id`) a batch carries a third tensor: the index of the document
each position belongs to within its sequence. Every eos opens a document (it is the separator that
comes before a document's first token, as a BOS would), so each document predicts its own tokens
and its closing eos from its own context only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from shoal.data.permutation import permute, round_keys
from shoal.data.stream import as_stream
from shoal.model.transformer import IGNORE
from shoal.errors import UserError

Batch = tuple[torch.Tensor, ...]  # (inputs, targets[, documents]), each int64 [micro_batch, seq_len]


@dataclass
class Part:
    """One corpus of a mixture."""

    name: str
    """As the user wrote it (a data.mix key), for messages and metrics."""
    tokens: object
    """A TokenStream, or anything as_stream takes (a numpy array)."""
    weight: float = 1.0
    mask: object | None = None
    """The loss mask beside `tokens` (0 where a token is not a target: a fine-tuning prompt), or None."""
    identity: str = ""
    """What the tokens are (Dataset.fingerprint), for noticing other tokens on resume; "" unknown."""


class TokenLoader:
    """Training batches from a token stream (one corpus) or a list of Parts (a mixture)."""

    def __init__(
        self,
        tokens,
        seq_len: int,
        global_batch: int,
        micro_batch: int,
        dp_rank: int = 0,
        dp_size: int = 1,
        seed: int = 0,
        *,
        source: str = "corpus",
        documents: int | None = None,
        repeat: bool = True,
    ):
        """`source` names a single corpus in messages (pass data.path); `documents` is the eos id
        when batches carry document indices (data.document_mask); `repeat=False` ends the data when a
        corpus has given every chunk once (see exhausted)."""
        _check_positive("train.seq_len", seq_len)
        _check_positive("train.micro_batch", micro_batch)
        _check_multiple("train.global_batch", global_batch, micro_batch * dp_size,
                        f"micro_batch*dp_size = {micro_batch}*{dp_size}")
        assert 0 <= dp_rank < dp_size, (dp_rank, dp_size)
        parts = tokens if isinstance(tokens, list) else [Part(source, tokens)]
        self.parts = [Part(p.name, as_stream(p.tokens), p.weight, p.mask, p.identity) for p in parts]
        self.seq_len, self.seed, self.documents, self.repeat = seq_len, seed, documents, repeat
        self.global_batch, self.micro_batch = global_batch, micro_batch
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.n_chunks = [_n_windows(p.tokens, seq_len, p.name, "corpus") for p in self.parts]
        total = sum(p.weight for p in self.parts)
        self.weights = [p.weight / total for p in self.parts]
        self.step = 0
        self.drawn = [0] * len(self.parts)
        """Sequences each corpus has given so far."""

    @property
    def epoch(self) -> float:
        """Passes over the corpus the steps so far have made; with a mixture, the most of any corpus."""
        return max(d / n for d, n in zip(self.drawn, self.n_chunks))

    def exhausted(self) -> str | None:
        """With repeat=False, which corpus the next step would start a second pass over, or None."""
        if self.repeat:
            return None
        picks, ordinals, _ = self._plan()
        over = [self.parts[i].name for i in set(picks.tolist()) if ordinals[picks == i].max() >= self.n_chunks[i]]
        return over[0] if over else None

    def next_step(self) -> list[Batch]:
        """This rank's micro-batches of the next global batch; advances the step."""
        picks, ordinals, drawn = self._plan()
        per_rank = self.global_batch // self.dp_size
        mine = slice(self.dp_rank * per_rank, (self.dp_rank + 1) * per_rank)
        windows = self._windows(picks[mine], ordinals[mine])
        self.step, self.drawn = self.step + 1, drawn
        return _micro_batches(windows, self.micro_batch, self.documents)

    def identity(self) -> str:
        """The corpora's fingerprints ("" when any is unknown)."""
        return ",".join(p.identity for p in self.parts) if all(p.identity for p in self.parts) else ""

    def tokens_drawn(self) -> dict[str, int]:
        """Training tokens each corpus has given so far (for the metrics of a mixture)."""
        return {p.name: d * self.seq_len for p, d in zip(self.parts, self.drawn)}

    def _plan(self) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """The next global batch: which corpus each sequence comes from, its ordinal in that corpus's
        endless order, and the counts after it."""
        picks, drawn = pick_sources(self.weights, self.drawn, self.global_batch)
        ordinals = np.empty(self.global_batch, dtype=np.int64)
        for i in range(len(self.parts)):
            sel = picks == i
            ordinals[sel] = self.drawn[i] + np.arange(int(sel.sum()))
        return picks, ordinals, drawn

    def _windows(self, picks: np.ndarray, ordinals: np.ndarray) -> np.ndarray:
        windows = np.empty((len(picks), self.seq_len + 1), dtype=np.int64)
        for i in np.unique(picks):
            sel = picks == i
            chunks = self._chunks(int(i), ordinals[sel])
            windows[sel] = _gather(self.parts[i], chunks * self.seq_len, self.seq_len + 1)
        return windows

    def _chunks(self, part: int, ordinals: np.ndarray) -> np.ndarray:
        """Chunk index of each ordinal in the part's endless shuffled order."""
        n = self.n_chunks[part]
        epochs, pos = np.divmod(ordinals, n)
        out = np.empty_like(ordinals)
        for e in np.unique(epochs):  # one or two epochs per step, unless the corpus is tiny
            sel = epochs == e
            out[sel] = permute(pos[sel], n, round_keys(self.seed, int(e), part))
        return out

    def state_dict(self) -> dict:
        # seed, n_chunks and sources are saved only to notice a changed setup on resume.
        return {"step": self.step, "seed": self.seed, "n_chunks": self.n_chunks, "drawn": list(self.drawn),
                "sources": [p.name for p in self.parts]}

    def load_state_dict(self, state: dict) -> str | None:
        """Take the saved position; returns what changed since it was saved (the caller, which knows
        which rank speaks, reports it), or None."""
        self.step = int(state["step"])
        names = [p.name for p in self.parts]
        saved_chunks = state.get("n_chunks", self.n_chunks)
        saved_chunks = saved_chunks if isinstance(saved_chunks, list) else [saved_chunks]
        if len(state.get("drawn", names)) == len(names):  # corpora renamed or moved go on from their counts
            # (the checkpointer compares what the tokens are); a state saved before mixtures existed has
            # no counts: its one corpus gave every sequence
            self.drawn = [int(d) for d in state.get("drawn", [self.step * self.global_batch])]
        else:  # another number of corpora than the one saved: take the new shares from here on
            self.drawn = [int(self.step * self.global_batch * w) for w in self.weights]
            return (f"data loader state was saved for the corpora {state.get('sources')}, now {names}: batches "
                    "after resume differ from the original run")
        if state.get("seed", self.seed) != self.seed or saved_chunks != self.n_chunks:
            return (f"data loader state was saved with seed={state.get('seed')} and {saved_chunks} "
                    f"sequences per epoch, now seed={self.seed} and {self.n_chunks}: the corpus, seq_len or seed "
                    "changed, so batches after resume differ from the original run")
        return None


def pick_sources(weights: list[float], drawn: list[int], k: int) -> tuple[np.ndarray, list[int]]:
    """Stride scheduling: the corpus of each of the next k sequences, and the counts after them."""
    counts = list(drawn)
    if len(weights) == 1:
        return np.zeros(k, dtype=np.int64), [counts[0] + k]
    picks = np.empty(k, dtype=np.int64)
    for s in range(k):
        i = min(range(len(weights)), key=lambda j: ((counts[j] + 1) / weights[j], j))
        counts[i] += 1
        picks[s] = i
    return picks, counts


def eval_batches(
    tokens,
    seq_len: int,
    batch: int,
    n_batches: int,
    dp_rank: int = 0,
    dp_size: int = 1,
    *,
    source: str = "corpus",
    documents: int | None = None,
) -> list[Batch]:
    """A fixed set of n_batches held-out batches (the same on every call), each of `batch`
    sequences globally of which this rank gets the r-th slice of batch/dp_size. With a mixture
    (a list of Parts holding held-out streams), the sequences are shared out by weight as in training.

    Each corpus's windows are spread evenly over its whole split rather than drawn at random, so
    the eval loss covers all of it and needs no seed.
    """
    _check_positive("train.seq_len", seq_len)
    _check_multiple("eval.batch", batch, dp_size, "dp_size")
    assert 0 <= dp_rank < dp_size, (dp_rank, dp_size)
    parts = tokens if isinstance(tokens, list) else [Part(source, tokens)]
    streams = [as_stream(p.tokens) for p in parts]
    total = batch * n_batches
    picks, counts = pick_sources([p.weight for p in parts], [0] * len(parts), total)
    starts = np.empty(total, dtype=np.int64)
    for i, (part, stream) in enumerate(zip(parts, streams)):
        n, m = _n_windows(stream, seq_len, part.name, "held-out split"), counts[i]
        # floor(j * n / m) is evenly spaced when there are enough windows; otherwise repeat them.
        j = np.arange(m, dtype=np.int64)
        starts[picks == i] = ((j * n) // m if m <= n else j % n) * seq_len
    per_rank = batch // dp_size
    out = []
    for b in range(n_batches):
        first = b * batch + dp_rank * per_rank
        sel = slice(first, first + per_rank)
        windows = np.empty((per_rank, seq_len + 1), dtype=np.int64)
        for i in np.unique(picks[sel]):
            rows = picks[sel] == i
            windows[rows] = _gather(parts[i], starts[sel][rows], seq_len + 1, streams[i])
        out += _micro_batches(windows, per_rank, documents)
    return out




def _gather(part: Part, starts: np.ndarray, n: int, tokens=None) -> np.ndarray:
    """Windows of the part's tokens, [len(starts), n] int64. Where the loss mask is 0 the token is
    stored as -1 - id: _micro_batches gives the id back as an input and IGNORE as a target."""
    windows = (part.tokens if tokens is None else tokens).windows(starts, n).astype(np.int64)
    if part.mask is not None:
        masked = as_stream(part.mask).windows(starts, n) == 0
        windows[masked] = -1 - windows[masked]
    return windows


def _micro_batches(windows: np.ndarray, micro_batch: int, documents: int | None) -> list[Batch]:
    windows = torch.from_numpy(windows.astype(np.int64, copy=False))
    # contiguous: a shifted view has gaps, and the model may .view() its input
    inputs, targets = windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
    if (masked := windows < 0).any():  # fine-tuning prompts (see _gather): inputs, never targets
        inputs = torch.where(masked[:, :-1], -1 - inputs, inputs)
        targets[masked[:, 1:]] = IGNORE
    if documents is None:
        return list(zip(inputs.split(micro_batch), targets.split(micro_batch)))
    docs = torch.cumsum(inputs == documents, dim=1)  # each eos opens the next document
    return list(zip(inputs.split(micro_batch), targets.split(micro_batch), docs.split(micro_batch)))


def _n_windows(tokens, seq_len: int, source: str, what: str) -> int:
    """How many windows of seq_len + 1 tokens start at multiples of seq_len."""
    n = (len(tokens) - 1) // seq_len
    if n < 1:
        fix = (f"{what} has {len(tokens)} tokens, fewer than seq_len+1 = {seq_len + 1}; "
               "use a larger corpus or a shorter seq_len")
        if what != "corpus":
            fix += " (or a larger data.val_fraction)"
        raise UserError("data.path", source, fix)
    return n


def _check_positive(field: str, value: int) -> None:
    if value < 1:
        raise UserError(field, value, "must be a positive integer")


def _check_multiple(field: str, value: int, step: int, step_desc: str) -> None:
    if value < 1 or value % step:
        lower = max(step, value // step * step)
        options = sorted({lower, lower + step})
        raise UserError(field, value, f"must be a multiple of {step_desc} = {step}; "
                                      f"try {' or '.join(map(str, options))}")
