"""Deterministic, resumable token batches, sharded by data-parallel rank.

The token stream is cut into non-overlapping chunks of seq_len tokens; a training sequence is
the window of seq_len + 1 tokens starting at a chunk (inputs are its first seq_len tokens,
targets the last seq_len). Chunks are visited in a seeded random order, reshuffled every epoch.

The global batch of step s is sequences [s*G, (s+1)*G) of that endless shuffled order. It depends
only on (seed, step) and the corpus -- never on dp_size or micro_batch -- so one process and any
number of data-parallel ranks train on exactly the same global batch, which is what makes loss
parity between layouts testable. Rank r takes the r-th contiguous slice of G/dp_size sequences and
cuts it into micro-batches:

    global batch (G = 8, dp_size = 2, micro_batch = 2)
    [ s0 s1 s2 s3 | s4 s5 s6 s7 ]
      rank 0        rank 1
     [s0 s1][s2 s3] [s4 s5][s6 s7]   <- micro-batches, in order

The resumable state is one integer, the next step, so a run resumed even on a different number of
ranks continues with the next global batch instead of repeating one.
"""

from __future__ import annotations


import numpy as np
import torch

from shoal.errors import UserError

Batch = tuple[torch.Tensor, torch.Tensor]  # (inputs, targets), both int64 [micro_batch, seq_len]


class TokenLoader:
    """Training batches from one token array (TokenCache.train)."""

    def __init__(
        self,
        tokens: np.ndarray,
        seq_len: int,
        global_batch: int,
        micro_batch: int,
        dp_rank: int = 0,
        dp_size: int = 1,
        seed: int = 0,
        *,
        source: str = "corpus",
    ):
        """`source` only names the data in error messages (pass data.path)."""
        _check_positive("train.seq_len", seq_len)
        _check_positive("train.micro_batch", micro_batch)
        _check_multiple("train.global_batch", global_batch, micro_batch * dp_size,
                        f"micro_batch*dp_size = {micro_batch}*{dp_size}")
        assert 0 <= dp_rank < dp_size, (dp_rank, dp_size)
        self.tokens, self.seq_len, self.seed = tokens, seq_len, seed
        self.global_batch, self.micro_batch = global_batch, micro_batch
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.n_chunks = _n_windows(tokens, seq_len, source, "corpus")
        self.step = 0
        self._perms: dict[int, np.ndarray] = {}

    @property
    def epoch(self) -> float:
        """How many passes over the corpus the steps so far have made (for logging)."""
        return self.step * self.global_batch / self.n_chunks

    def next_step(self) -> list[Batch]:
        """This rank's micro-batches of the next global batch; advances the step."""
        per_rank = self.global_batch // self.dp_size
        first = self.step * self.global_batch + self.dp_rank * per_rank
        chunks = self._chunks(np.arange(first, first + per_rank, dtype=np.int64))
        self.step += 1
        return _micro_batches(self.tokens, chunks * self.seq_len, self.seq_len, self.micro_batch)

    def _chunks(self, k: np.ndarray) -> np.ndarray:
        """Chunk index of the k-th sequence of the endless shuffled order."""
        epochs, pos = np.divmod(k, self.n_chunks)
        out = np.empty_like(k)
        for e in np.unique(epochs):  # one or two epochs per step, unless the corpus is tiny
            mask = epochs == e
            out[mask] = self._perm(int(e))[pos[mask]]
        return out

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            # Keep only recent epochs: steps move forward, so older permutations are never needed again.
            self._perms = {e: p for e, p in self._perms.items() if e >= epoch - 1}
            self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.n_chunks)
        return self._perms[epoch]

    def state_dict(self) -> dict[str, int]:
        # seed and n_chunks are saved only to notice a changed setup on resume.
        return {"step": self.step, "seed": self.seed, "n_chunks": self.n_chunks}

    def load_state_dict(self, state: dict[str, int]) -> str | None:
        """Take the saved position; returns what changed since it was saved (the caller, which knows
        which rank speaks, reports it), or None."""
        self.step = int(state["step"])
        if state.get("seed", self.seed) != self.seed or state.get("n_chunks", self.n_chunks) != self.n_chunks:
            return (f"data loader state was saved with seed={state.get('seed')} and {state.get('n_chunks')} "
                    f"sequences per epoch, now seed={self.seed} and {self.n_chunks}: the corpus, seq_len or seed "
                    "changed, so batches after resume differ from the original run")
        return None


def eval_batches(
    tokens: np.ndarray,
    seq_len: int,
    batch: int,
    n_batches: int,
    dp_rank: int = 0,
    dp_size: int = 1,
    *,
    source: str = "corpus",
) -> list[Batch]:
    """A fixed set of n_batches held-out batches (the same on every call), each of `batch`
    sequences globally of which this rank gets the r-th slice of batch/dp_size.

    Windows are spread evenly over the whole split rather than drawn at random, so the eval loss
    covers all of it and needs no seed.
    """
    _check_positive("train.seq_len", seq_len)
    _check_multiple("eval.batch", batch, dp_size, "dp_size")
    assert 0 <= dp_rank < dp_size, (dp_rank, dp_size)
    n = _n_windows(tokens, seq_len, source, "held-out split")
    total = batch * n_batches
    # floor(i * n / total) is evenly spaced when there are enough windows; otherwise repeat them.
    chunks = (np.arange(total, dtype=np.int64) * n) // total if total <= n else np.arange(total, dtype=np.int64) % n
    per_rank = batch // dp_size
    out = []
    for b in range(n_batches):
        first = b * batch + dp_rank * per_rank
        out += _micro_batches(tokens, chunks[first:first + per_rank] * seq_len, seq_len, per_rank)
    return out


def _micro_batches(tokens: np.ndarray, starts: np.ndarray, seq_len: int, micro_batch: int) -> list[Batch]:
    # One gather for the whole rank's share; fancy indexing also works on a memmap.
    windows = tokens[starts[:, None] + np.arange(seq_len + 1)]  # [n, seq_len + 1]
    windows = torch.from_numpy(windows.astype(np.int64))
    # contiguous: a shifted view has gaps, and the model may .view() its input
    return [(w[:, :-1].contiguous(), w[:, 1:].contiguous()) for w in windows.split(micro_batch)]


def _n_windows(tokens: np.ndarray, seq_len: int, source: str, what: str) -> int:
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
