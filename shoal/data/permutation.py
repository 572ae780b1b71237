"""A seeded random permutation of range(n) computed one element at a time, in O(1) memory.

The loader visits a corpus's chunks in a shuffled order; a permutation array (numpy's
`permutation(n)`) would take 8 bytes per chunk on every rank, growing with the corpus (a 1 TB
corpus at seq_len 2048 is ~10^8 chunks: 0.8 GB per rank). Instead, chunk k of an epoch is
`permute(k)`: a 4-round Feistel network on the smallest even number of bits that holds n, a
bijection on that power of two, with cycle-walking (apply again while the result is >= n) to
stay inside range(n). Since the domain is < 4n, a walk takes under 4 applications on average.
The round keys come from (seed, epoch), so every epoch has its own order.
"""

from __future__ import annotations

import numpy as np

ROUNDS = 4
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a fast 64-bit hash with full avalanche."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def round_keys(seed: int, epoch: int, source: int = 0) -> np.ndarray:
    return np.random.SeedSequence([seed, epoch, source]).generate_state(ROUNDS, dtype=np.uint64)


def permute(k: np.ndarray, n: int, keys: np.ndarray) -> np.ndarray:
    """The images of indices k (each in range(n)) under the permutation the keys define."""
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    mask, shift = np.uint64((1 << half) - 1), np.uint64(half)

    def feistel(x: np.ndarray) -> np.ndarray:
        left, right = x >> shift, x & mask
        for key in keys:
            left, right = right, left ^ (_mix(right ^ key) & mask)
        return (left << shift) | right

    with np.errstate(over="ignore"):  # the multiplications wrap modulo 2**64 on purpose
        out = feistel(np.asarray(k, dtype=np.uint64))
        outside = out >= np.uint64(n)
        while outside.any():
            out[outside] = feistel(out[outside])
            outside = out >= np.uint64(n)
    return out.astype(np.int64)
