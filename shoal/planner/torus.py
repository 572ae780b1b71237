"""Where a process group lies on a TPU slice's torus, for the collective times (collectives.py).

A TPU v4/v5p slice is one 3D torus over ICI: each chip links to its six neighbours, and slices of whole
4x4x4 cubes are joined through optical circuit switches with the same ICI links, wraparound included
(Jouppi et al., "TPU v4", ISCA 2023, §2; How To Scale Your Model, "TPUs" chapter: "Any multiple of a full
cube (e.g. 4x4x4 or 4x4x8) will have wraparounds provided by the optical switches"). Smaller slices
(2x2x1 ... 2x4x4) have no wraparound. TPU v5e is a 2D torus of up to 16x16 with wraparound on axes of 16
only (same chapter); a slice whose axes are not all 16 is planned without (8x16 is then pessimistic).

A collective over one torus axis runs as a bidirectional ring: V/W_bidi for an all-gather of V bytes,
in ceil(d/2) hops; over several axes the bandwidth adds up, V/(W_bidi·n_axes), and the hops of each axis
add (How To Scale Your Model, "Sharded Matrices", the AllGather over multiple axes).
"""

from __future__ import annotations

import itertools
import math
import operator
from functools import lru_cache

@lru_cache(maxsize=256)
def slice_shape(chips: int, dims: int) -> tuple[int, ...]:
    """The torus axes of a slice of `chips` chips, largest first. Google's v5p topologies grow from a
    2x2x1 host group to the 4x4x4 cube and then by doubling the shortest axis (4x4x8, 4x8x8, 8x8x8,
    ...): each prime factor, largest first, multiplies the shortest axis (a full v5p pod, 8,960 chips,
    comes out as its published 16x20x28)."""
    primes, n, f = [], chips, 2
    while n > 1:
        while n % f == 0:
            primes.append(f)
            n //= f
        f += 1
    shape = [1] * dims
    for p in sorted(primes, reverse=True):
        shape[shape.index(min(shape))] *= p
    return tuple(sorted(shape, reverse=True))


@lru_cache(maxsize=256)
def has_wraparound(shape: tuple[int, ...], side: int) -> bool:
    """Rings close only on slices whose every axis is a multiple of `side` (the catalog's torus_wrap_side:
    v4/v5p 4, whole cubes joined by the optical switches; v5e 16, its full axis)."""
    return all(d >= side and d % side == 0 for d in shape)


@lru_cache(maxsize=4096)
def axes_spanned(shape: tuple[int, ...], n: int, stride: int) -> tuple[int, ...]:
    """The sizes of the slice axes a group of n ranks, `stride` apart, spans. The layout's dimensions fill
    the axes innermost (tp) first, each taking whole axes where their sizes allow it, as jax's
    mesh_utils.create_device_mesh assigns a logical mesh axis to physical axes of matching size (MaxText's
    tensor axis of 4 or 8 gets one axis, FSDP the others; PaLM's 12-way model axis on a 12x16x16 pod).
    The axes are taken in the first order whose boundaries fall at `stride` and at stride·n, largest
    first otherwise; an axis whose rank range overlaps stride .. stride·n is one the group spans."""
    lo, hi = stride, stride * n
    orders = sorted(set(itertools.permutations(shape)), key=lambda o: [-d for d in o])
    order = next((o for o in orders if {lo, hi} <= set(itertools.accumulate(o, operator.mul, initial=1))), orders[0])
    p, axes = 1, []
    for d in order:
        if p * d > lo and p < hi:
            axes.append(min(d, math.ceil(hi / p)))
        p *= d
    return tuple(axes) or (n,)


@lru_cache(maxsize=1024)
def ring_hops(axes: tuple[int, ...], wraparound: bool) -> int:
    """Hops of a collective along these axes: ceil(d/2) on a ring that closes, d-1 on a line."""
    return sum((math.ceil(d / 2) if wraparound else d - 1) for d in axes)


def tp_reach(shape: tuple[int, ...], gpus_per_node: int) -> int:
    """The widest tensor-parallel group worth searching: a node's GPUs, or on a torus the slice's longest
    axis (TP crosses the layer's critical path; MaxText's configs keep it within one axis, 4-16)."""
    return max(shape) if shape else gpus_per_node
