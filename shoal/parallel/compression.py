"""Compressed gradient reduction over the data-parallel group (`parallel.grad_compression`).

Each method is a DDP comm hook: DDP hands it one bucket (a flat fp32 buffer of several parameters'
gradients) and it must leave the average over ranks there. Under FSDP2 the same methods average
each unit's flat gradient shard across dp_replicate (compression_fsdp.py). What each puts on the wire, per rank
per step, for n gradient elements on p ranks (plain: the fp32 ring all-reduce, 2(p-1)/p * 4n):

    bf16      all-reduce in bf16 (torch's bf16_compress_hook)             1/2 of plain
    int8      quantize -> all-to-all -> sum in fp32 -> quantize ->         ~1/4 of plain
              all-gather, an fp32 scale per CHUNK values. Each value is quantized once on the way
              in and once on the way out, so error does not build up along a ring (ZeRO++ qgZ).
    topk      the k = density*n largest |values| of (gradient + error)   ~ p*density of plain
              with int32 indices, all-gathered (supports differ by rank);
              what was not sent is kept and added next step (error feedback);
              after topk_warmup plain steps (see TopK).
    powersgd  per matrix M (gradient + error), rank r: P = M Q, mean P,   (m+k)r / mk of plain
              orthonormalize, Q = M^T P, mean Q, use P Q^T; vectors and
              small matrices go in one plain all-reduce. Q is warm-started
              from the last step (a power iteration across steps).

Why our own PowerSGD and not torch's powerSGD_hook: torch keys its error and P/Q memories by bucket
index, and DDP rebuilds its buckets after the first step, so a resumed run's first step would add
one parameter's error to another's gradient; here all state is keyed by parameter name, which also
makes it checkpointable under any bucketing. (torch's batched variant fails at its first
compressed step on any backend.)

Every rank ends each bucket with the same values (all-gathers and means of identical inputs), so
replicas stay identical as with a plain all-reduce. Degenerate settings equal the plain path:
topk at density 1 sends every value (bitwise equal to the all-reduce on 2 ranks), PowerSGD at a
rank >= the gradients' rank reconstructs them exactly, to within fp32 rounding of P and Q on the
wire given headroom for the warm start (tests/dist/compression_worker.py says how much).
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.distributed as dist
from torch import nn

from shoal.comm import ops
from shoal.comm.counter import CommCounter
from shoal.comm.renamed import all_gather_single
from shoal.model.transformer import param_name

CHUNK = 256
"""int8: values per fp32 scale (4 bytes of scale per 256 bytes of data: 1.6% overhead)."""

Segment = tuple[str, torch.Size]
"""One parameter's piece of a flat gradient buffer, in order: its name (the key of its state) and
the shape its gradient has there (the whole parameter under DDP, this rank's padded shard under FSDP)."""


def build_compressor(method: str, model: nn.Module, group, parallel_cfg, seed: int = 0) -> "Compressor | None":
    """The hook state for `method` on `model`'s gradients, averaged over `group` (None for `none`)."""
    kinds = {"bf16": Bf16, "int8": Int8, "topk": TopK, "powersgd": PowerSGD}
    if method == "none":
        return None
    return kinds[method](model, group, parallel_cfg, seed)


class Compressor:
    """A DDP comm hook with state: `ddp.register_comm_hook(c, Compressor.hook)`.

    Counts, per step, the bytes its collectives put on the wire (`sent`, with the same CommCounter
    the trainer uses) and what a plain fp32 all-reduce of the same gradients would have (`plain`);
    `state_dict()` holds what must survive a restart, keyed by parameter name."""

    def __init__(self, model: nn.Module, group, parallel_cfg, seed: int):
        self.group, self.world = group, dist.get_world_size(group)
        self.names = {id(p): param_name(name) for name, p in model.named_parameters()}  # checkpoint keys
        self.device = next(model.parameters()).device  # where loaded state goes (a checkpoint loads on CPU)
        self.step = 0  # optimizer steps whose gradients this reduced
        self.warmup = 0  # steps reduced with a plain all-reduce before compressing
        self.sent = self.plain = 0

    @staticmethod
    def hook(self, bucket):  # no annotations: DDP compares them with Future[Tensor] objects, not strings
        segments = [(self.names[id(p)], p.shape) for p in bucket.parameters()]
        out = self.reduce_counted(bucket.buffer(), segments, last=bucket.is_last())
        if not isinstance(out, torch.Tensor):  # already a future (torch's bf16 hook)
            return out
        fut = torch.futures.Future()
        fut.set_result(out)
        return fut

    def reduce_counted(self, flat: torch.Tensor, segments: list[Segment], last: bool):
        """Reduce one flat gradient buffer (DDP's bucket, or one FSDP unit's shard: compression_fsdp.py),
        counting what went on the wire and what a plain fp32 all-reduce would have sent."""
        self.plain += int(ops.wire_bytes("all_reduce", flat.numel() * flat.element_size(), self.world))
        with CommCounter() as c:
            out = self._mean_(flat) if self.step < self.warmup else self.reduce(flat, segments)
        self.sent += sum(c.bytes.values())
        if last:
            self.step += 1
        return out

    def reduce(self, flat: torch.Tensor, segments: list[Segment]):
        raise NotImplementedError

    def take_bytes(self) -> tuple[int, int]:
        """(sent, plain) since the last call."""
        out, (self.sent, self.plain) = (self.sent, self.plain), (0, 0)
        return out

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"step": torch.tensor([self.step], dtype=torch.int64)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if "step" in state:
            self.step = int(state["step"][0])

    def _mean_(self, x: torch.Tensor) -> torch.Tensor:
        x.div_(self.world)
        dist.all_reduce(x, group=self.group)
        return x


class Bf16(Compressor):
    def reduce(self, flat, segments):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

        return bf16_compress_hook(self.group, (flat,))  # torch's hook; it takes a (buffer,) tuple too


class Int8(Compressor):
    def reduce(self, flat, segments):
        return quantized_mean_(flat, self.group, "int8")


def quantized_mean_(flat: torch.Tensor, group, bits: str) -> torch.Tensor:
    """The mean of `flat` over `group`, in place, sent in `bits` ("int8", "fp4": CODECS) with per-chunk
    scales: gradient compression's int8 and DiLoCo's quantized pseudo-gradient."""
    encode, decode = CODECS[bits]
    p, n = dist.get_world_size(group), flat.numel()
    per_rank = math.ceil(n / (p * CHUNK)) * CHUNK
    x = flat.new_zeros(p * per_rank)
    x[:n] = flat
    # 1. Each rank quantizes its whole gradient and sends rank j the j-th slice.
    q, scale = encode(x)
    q_in, s_in = torch.empty_like(q), torch.empty_like(scale)
    dist.all_to_all_single(q_in, q, group=group)
    dist.all_to_all_single(s_in, scale, group=group)
    # 2. Sum the p contributions to my slice in fp32, then quantize the mean once more.
    mine = decode(q_in, s_in).view(p, per_rank).sum(0).div_(p)
    q_mine, s_mine = encode(mine)
    # 3. Everyone gathers every slice.
    q_all, s_all = torch.empty_like(q), torch.empty_like(scale)
    _all_gather(q_all, q_mine, group=group)
    _all_gather(s_all, s_mine, group=group)
    flat.copy_(decode(q_all, s_all)[:n])
    return flat


def _all_gather(out: torch.Tensor, x: torch.Tensor, group) -> None:
    all_gather_single(out, x, group=group)


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per CHUNK values (len(x) a multiple of CHUNK): int8 values and fp32 scales."""
    x_CC = x.view(-1, CHUNK)
    scale = x_CC.abs().amax(1).div_(127.0).clamp_(min=torch.finfo(torch.float32).tiny)
    return torch.round(x_CC / scale[:, None]).clamp_(-127, 127).to(torch.int8).view(-1), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (q.view(-1, CHUNK).float() * scale[:, None]).view(-1)


FP4_SMALLEST = 2.0 ** -6
"""4-bit values are a sign and a code c in 0..7: 0 is zero, c >= 1 is scale * 2**(c - 7), the seven
powers of two from the chunk's largest magnitude (the scale, fp32, one per CHUNK values) down to 1/64
of it. Streaming DiLoCo (Douillard et al. 2025) sends its outer gradients as E3M0, a sign and a power
of two with no mantissa; this is that with a zero."""


def quantize_fp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """4 bits per value, two to a byte (uint8, len(x)/2 of them), and an fp32 scale per CHUNK values.
    A magnitude goes to the nearer in value of the two powers of two around it (at most a third off),
    and below half the smallest to zero."""
    x_CC = x.view(-1, CHUNK)
    scale = x_CC.abs().amax(1).clamp_(min=torch.finfo(torch.float32).tiny)
    r = x_CC.abs() / scale[:, None]  # in [0, 1]
    low = torch.floor(torch.log2(r.clamp(min=FP4_SMALLEST / 2)))  # r in [2**low, 2**(low+1))
    code = (low + (r > 1.5 * torch.exp2(low)) + 7).clamp_(1, 7)
    code = torch.where(r < FP4_SMALLEST / 2, torch.zeros_like(code), code)
    nibble = (code + 8 * (x_CC < 0)).to(torch.uint8).view(-1)
    return nibble[0::2] | (nibble[1::2] << 4), scale


def dequantize_fp4(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    nibble = torch.stack([q & 15, q >> 4], dim=1).view(-1, CHUNK).float()
    code, negative = nibble % 8, nibble >= 8
    magnitude = torch.where(code > 0, torch.exp2(code - 7), torch.zeros_like(code))
    return (torch.where(negative, -magnitude, magnitude) * scale[:, None]).view(-1)


CODECS = {"int8": (quantize, dequantize), "fp4": (quantize_fp4, dequantize_fp4)}
"""What quantized_mean_ sends: (encode, decode) by name."""


class TopK(Compressor):
    """Why a warm-up (`parallel.topk_warmup` plain steps first): AdamW divides each coordinate's
    update by the root of its second-moment estimate v, bias-corrected from step 1. Sparsified, a
    coordinate's gradient arrives in rare bursts (its accumulated error), and v follows the bursts
    (an average over ~1/(1-beta2) = 20 steps at train.beta2 = 0.95), so rarely sent coordinates take
    smaller steps. Dense steps first keep that off the early steps, when AdamW's updates matter most:
    the remedy of DGC's warm-up training (Lin et al. 2018) and 1-bit Adam's uncompressed warm-up
    (Tang et al. 2021). bench/bench_compression.py, 600 steps, 3 seeds, top-k 10%: eval-loss gap
    +7.50% with no warm-up, +3.36% with 30 steps (5% of the run). What else was tried, and did worse:
    docs/parallelism.md."""

    def __init__(self, model, group, parallel_cfg, seed):
        super().__init__(model, group, parallel_cfg, seed)
        self.density, self.warmup = parallel_cfg.topk_density, parallel_cfg.topk_warmup
        self.error: dict[str, torch.Tensor] = {}

    def reduce(self, flat, segments):
        names, sizes = [n for n, _ in segments], [shape.numel() for _, shape in segments]
        # Error feedback: add what earlier steps did not send (per parameter, so bucketing can change).
        error = torch.cat([self.error[n].view(-1) if n in self.error else flat.new_zeros(size)
                           for n, size in zip(names, sizes)])
        acc = flat + error
        # One selection over the bucket: one per parameter, or vectors sent dense, did worse (docs/parallelism.md).
        k = max(1, math.ceil(self.density * acc.numel()))
        _, idx = acc.abs().topk(k, sorted=False)
        # Divide before summing, as the plain hook does: density 1 then equals it bit for bit.
        vals = acc[idx].div_(self.world)
        sent = torch.zeros_like(acc).index_put_((idx,), acc[idx])
        left = acc.sub_(sent)  # what stays behind: g + e_old = C(g + e_old) + e_new
        for n, e in zip(names, left.split(sizes)):
            self.error[n] = e.clone()
        vals_all = vals.new_empty(k * self.world)
        idx_all = torch.empty(k * self.world, dtype=torch.int32, device=flat.device)
        _all_gather(vals_all, vals, group=self.group)
        _all_gather(idx_all, idx.to(torch.int32), group=self.group)
        flat.zero_()
        for r in range(self.world):  # rank order, so every rank sums identically
            flat.index_add_(0, idx_all[r * k:(r + 1) * k].long(), vals_all[r * k:(r + 1) * k])
        return flat

    def state_dict(self):
        return super().state_dict() | {f"error.{n}": e for n, e in self.error.items()}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.error = {k.removeprefix("error."): v.to(self.device, copy=True) for k, v in state.items()
                      if k.startswith("error.")}


class PowerSGD(Compressor):
    def __init__(self, model, group, parallel_cfg, seed):
        super().__init__(model, group, parallel_cfg, seed)
        self.rank, self.warmup, self.seed = parallel_cfg.powersgd_rank, parallel_cfg.powersgd_warmup, seed
        self.error: dict[str, torch.Tensor] = {}
        self.q: dict[str, torch.Tensor] = {}

    def shape(self, shape: torch.Size) -> tuple[int, int, int] | None:
        """(m, k, r) when compressing a gradient of this shape as an m x k matrix saves bytes, else None (sent plain)."""
        if len(shape) < 2 or shape.numel() == 0:
            return None
        m, k = shape[0], shape.numel() // shape[0]
        r = min(self.rank, m, k)
        return (m, k, r) if r * (m + k) < m * k else None

    def reduce(self, flat, segments):
        views = flat.split([shape.numel() for _, shape in segments])
        plain = [v for v, (_, shape) in zip(views, segments) if self.shape(shape) is None]
        mats = [(n, v, self.shape(shape)) for v, (n, shape) in zip(views, segments) if self.shape(shape) is not None]
        if plain:
            cat = self._mean_(torch.cat(plain))
            for v, x in zip(plain, cat.split([v.numel() for v in plain])):
                v.copy_(x)
        if not mats:
            return flat
        # Local matrix math in float64, the wire in float32. In fp32, the QR of a rank-deficient P
        # leaks roundoff into gradients that are exactly zero (embedding rows of unused tokens), and
        # AdamW's normalization turns 1e-9 there into full-size updates (the degenerate test saw it).
        ms = []
        for n, v, (m, k, r) in mats:
            mat = v.view(m, k).double()
            ms.append(mat + self.error[n] if n in self.error else mat)
            if n not in self.q:
                self.q[n] = self._random(n, k, r).to(flat.device)
        # P = M Q for every matrix, averaged in one all-reduce, then orthonormalized.
        ps = self._mean_list([mat @ self._refreshed(n, self.q[n]) for mat, (n, _, _) in zip(ms, mats)])
        ps = [torch.linalg.qr(p_).Q for p_ in ps]
        # Q = M^T P: each rank's own reconstruction P Q_mine^T sets its error (the paper's error
        # feedback); the averaged Q gives the update every rank applies: P mean(Q)^T = mean(P Q_i^T).
        qs_mine = [mat.t() @ p_ for mat, p_ in zip(ms, ps)]
        for mat, p_, q_, (n, _, _) in zip(ms, ps, qs_mine, mats):
            self.error[n] = (mat - p_ @ q_.t()).float()
        qs = self._mean_list(qs_mine)
        for (n, v, _), p_, q_ in zip(mats, ps, qs):
            self.q[n] = q_.float()
            v.copy_((p_ @ q_.t()).view(-1))
        return flat

    def _mean_list(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The mean over ranks of several (float64) tensors, in one float32 all-reduce."""
        cat = self._mean_(torch.cat([x.reshape(-1) for x in xs]).float()).double()
        return [c.view(x.shape) for c, x in zip(cat.split([x.numel() for x in xs]), xs)]

    def _random(self, name: str, k: int, r: int, salt: int = 0) -> torch.Tensor:
        """The same random k x r matrix on every rank, from (seed, name, salt) alone (no state to save)."""
        # crc32, not hash(): str hashes differ from process to process
        g = torch.Generator().manual_seed(zlib.crc32(f"{self.seed}/{name}/{salt}".encode()))
        return torch.randn(k, r, generator=g)

    def _refreshed(self, name: str, q: torch.Tensor) -> torch.Tensor:
        """Q orthonormalized, with columns that lost rank refilled at random. A warm-started Q has
        the rank of last step's gradient: left as is, a gradient of higher rank would be projected
        onto the lower-rank subspace for good. The span, all P = M Q depends on, is otherwise kept."""
        basis, tri = torch.linalg.qr(q.double())
        diag = tri.diagonal().abs()
        dead = diag <= 1e-6 * diag.max().clamp(min=1e-30)
        if bool(dead.any()):
            basis[:, dead] = self._random(name, q.shape[0], int(dead.sum()), salt=self.step + 1).to(basis)
            basis = torch.linalg.qr(basis).Q
        return basis

    def state_dict(self):
        return (super().state_dict() | {f"error.{n}": e for n, e in self.error.items()}
                | {f"q.{n}": q for n, q in self.q.items()})

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.error = {k.removeprefix("error."): v.to(self.device, copy=True) for k, v in state.items()
                      if k.startswith("error.")}
        self.q = {k.removeprefix("q."): v.to(self.device, copy=True) for k, v in state.items()
                  if k.startswith("q.")}


def wire_fields(pm, counter: CommCounter, method: str) -> dict:
    """A metrics row's gradient bytes, sent and as a plain fp32 all-reduce would have sent them, and
    the step's total bytes with gradients uncompressed (beside comm_bytes, what was sent)."""
    if method == "none":
        return {}
    if pm.grad_compressor is not None:
        sent, plain = pm.grad_compressor.take_bytes()
    else:  # FSDP2 with a bf16 reduce dtype: its reduce-scatters and (replicate, HSDP) all-reduces
        # are gradients (tensor parallelism's bf16 activation collectives would count here too)
        sent = sum(counter.by_dtype.get(f"{k}:bfloat16", 0) for k in ("reduce_scatter", "all_reduce"))
        plain = 2 * sent
    total = sum(counter.bytes.values())
    return {"grad_bytes": sent, "grad_bytes_uncompressed": plain, "comm_bytes_uncompressed": total - sent + plain}
