"""What one accelerator and its links can do, as the fields the planner reads (`GPU`): the record every
hardware catalog entry (catalog.py), the measured `local` machine (local.py) and a --hw-file fill in.

Peaks are the vendors' dense figures; the `*_efficiency` fields say what fraction of a peak real kernels reach.
Bandwidths are bytes/s per GPU in one direction (NVLink "900 GB/s" is 450 GB/s each way); a `*_efficiency`
turns that into the bus bandwidth nccl-tests would report (DESIGN.md conventions).
"""

from __future__ import annotations

from dataclasses import dataclass


GiB = 2**30


POWER_CLOCK_EXPONENT = 0.30
"""How a power-capped GPU's dense throughput falls with its power limit, from two datasheet points of
one die: H100 NVL (132 SMs, 350-400 W) peaks at 835 dense BF16 TFLOP/s and H100 SXM (132 SMs, 700 W)
at 989, so 835/989 = (400/700) ** 0.30. Derived, approximate (a power law through two points)."""

FP8_MATMUL_RATIO = 0.734 / 0.803
"""An FP8 GEMM reaches a smaller fraction of its (twice as high) peak than a BF16 one: ml-engineering's
MAMF table measures H200 FP8 at 1453.4 of 1979 TFLOP/s (73.4%) against 80.3% for BF16 on the same chip.
So an FP8 GEMM runs at peak_fp8_flops x matmul_efficiency x 0.914 (the ratio of the two measurements), on
every device whose own pair is not measured (GPU.fp8_matmul_ratio)."""

@dataclass(frozen=True)
class GPU:
    name: str
    """Catalog key, the value of `--gpu`."""
    peak_bf16_flops: float
    """Dense BF16 peak, FLOP/s, no sparsity. The MFU denominator."""
    matmul_efficiency: float
    """Fraction of the peak a large BF16 GEMM sustains in training: all GPUs busy, clocks at the power
    limit (maximum *sustainable* matmul FLOPs, not the short-burst maximum)."""
    attention_efficiency: float
    """Fraction of the peak the device's own fused attention kernel reaches at head dim 128, forward and
    backward together, counting the FLOPs the kernel really does (causal: half; backward 2.5x forward):
    cuDNN's (FlashAttention-3-like) on Hopper and newer, FlashAttention-2 on Ampere."""
    hbm_bytes: float
    """Memory one process can use, bytes (what the driver reports, not the marketing GB)."""
    hbm_bandwidth: float
    """Peak memory bandwidth, bytes/s."""
    hbm_efficiency: float
    """Fraction of hbm_bandwidth a streaming kernel (copy, elementwise, optimizer step) reaches."""
    gpus_per_node: int
    """Devices joined by the fast intra-node fabric (NVLink/NVSwitch, Infinity Fabric; a TPU's ICI pod)."""
    intra_node_bandwidth: float
    """Per-GPU fabric bandwidth inside a node, one direction, bytes/s."""
    intra_node_efficiency: float
    """nccl-tests bus bandwidth inside a node as a fraction of intra_node_bandwidth."""
    intra_node_latency: float
    """Seconds per step of a collective inside a node (the alpha of the alpha-beta model)."""
    inter_node_bandwidth: float
    """Per-GPU network bandwidth between nodes (its own NIC), one direction, bytes/s."""
    inter_node_efficiency: float
    """nccl-tests bus bandwidth across nodes as a fraction of inter_node_bandwidth."""
    inter_node_latency: float
    """Seconds per step of a collective across nodes."""
    nodes_per_leaf: int = 0
    """Nodes with full bisection bandwidth among themselves (a leaf or rail group); 0: one non-blocking fabric."""
    oversubscription: float = 1.0
    """Leaf downlink : uplink bandwidth ratio above nodes_per_leaf (1: non-blocking, Llama 3's pods: 7)."""
    torus_dims: int = 0
    """0: the node is switched (NVSwitch): every group inside it gets intra_node_bandwidth. n > 0: the
    node's devices form an n-dimensional torus (TPU v4/v5p: 3) and intra_node_bandwidth is per torus
    axis, so a group gets it once for each axis it spans (planner/torus.py)."""
    fabric: str = "NVLink"
    """What the intra-node fabric is called in the plan's explanations (Infinity Fabric, a TPU's ICI)."""
    torus_wrap_side: int = 4
    """On a torus: the axis length whose multiples close into rings (v4/v5p 4: slices of whole 4x4x4 cubes
    get their wraparound from the optical switches; v5e 16: only a full axis wraps). Smaller slices are
    lines, with half the bandwidth (planner/torus.py)."""
    overlap_cost: float = 0.15
    """Share of a collective's duration still paid when it is hidden behind compute. GPUs: NCCL runs one
    thread block per channel, each on its own SM, and opens 16-32 channels on NVSwitch nodes
    (NCCL_MIN_NCHANNELS/NCCL_MAX_NCHANNELS; nccl-tests prints the count), i.e. 12-24% of an H100's 132
    SMs or 15-30% of an A100's 108, and streams its buffers through HBM; 0.15 is the low end of that SM
    share (derived, not measured; DeepSeek-V3's all-to-all kernels hold 20 of an H800's 132 SMs, arXiv:2412.19437
    §3.2.2 and §3.5.1). Used for the expert all-to-all, the context-parallel ring and offload copies; the
    data-parallel rings, whose interference was measured, use ring_overlap_cost. `local`: 1.0, a CPU rank has one core and gloo's send/receive
    threads run on it too, so nothing overlaps."""
    ring_overlap_cost: float = 0.61
    """The same for the data-parallel rings (FSDP's per-layer all-gathers and reduce-scatters, the gradient
    reduction and parameter gather of DDP and ZeRO-1/2) when they run over NVLink at its bus bandwidth;
    a ring held back by the network costs its bus bandwidth's share of this (planner/data_parallel.py,
    ring_overlap_cost). Derived from Lee et al., "Characterizing Compute-Communication Overlap in
    GPU-Accelerated Distributed Deep Learning" (arXiv:2507.03114, 2025; GPT and LLaMA training on four A100,
    H100, MI250 and MI210 of one node): overlapped, the compute ran 18.9% slower on average than with no
    communication beside it, and running compute and communication one after the other was only 10.2%
    slower than overlapping them; so the communication took (1.102 x 1.189 - 1) = 0.31 of the compute time
    and the overlap still paid 0.189 / 0.31 = 0.61 of it (a ratio of the paper's two averages, approximate).
    More than NCCL's SM share (overlap_cost) because the ring also streams its bytes through HBM and L2, and a
    GEMM that filled the SMs in whole waves spills into one more wave (an H100 GEMM of 132 blocks beside a
    24-block ncclAllGather took nearly twice as long: NVIDIA developer forums, "Compute-Communication Overlap
    Causes Severe GEMM Performance Degradation because of Tail Effect", 2025). `local`: 1.0, as overlap_cost.
    Not used on XLA devices (TPUs), whose collectives keep overlap_cost."""
    kernel_gap: float = 2e-6
    """Seconds each kernel costs beyond its work: launch and the idle gap between dependent kernels
    (eager PyTorch on a CPU: the per-op dispatch cost). What makes tiny models slow. 2 us is the order
    of a CUDA launch seen back-to-back on the GPU (a few microseconds, NVIDIA's CUDA graphs notes);
    approximate: the `local` entry measures its own (op_overhead)."""
    host_op_cost: float = 8.1e-6
    """Seconds the host takes to issue one eager PyTorch op (Python, the dispatcher, the launch), where the
    device waits for it: after a host sync the device's queue is empty, and ops smaller than this keep it
    so (compute.moe_host_time). Measured on the H200 host (bench/gpu_kernels.py, docs/measurements/
    h200-kernels.json: `x.add_` 8.1 us; 8.1-10.7 over three runs); taken for every GPU host, not measured
    on others. `local`: 0, derived from its measured kernel_gap (compute.host_op_cost)."""
    host_gemm_cost: float = 29.2e-6
    """The same for an op that launches a GEMM (cuBLAS): an nn.Linear call measured 29.2 us on the same H200
    host (29-38 over three runs), 3.6 plain ops. `local`: 0, host_op_cost (a CPU GEMM's own work is its time)."""
    kernel_gap_one_process: float = 0.0
    """`local` only: kernel_gap when a single process runs torch's threads on every core (each op
    also pays OpenMP's fork and join; measured); 0: kernel_gap."""
    tp_kernel_overhead: float = 0.0
    """Seconds each kernel of a tensor-parallel layer (and each op of an unfused optimizer step on
    DTensor parameters) costs on top of kernel_gap: DTensor's host work (sharding propagation,
    redistribution, wrapping each op's tensors). `local` measures it (~0.1 ms,
    ~10x a plain op's dispatch). 0 on GPUs: the host runs ahead of the device there and this work
    hides behind the kernels (not measured in this repo)."""
    tp_redistribute_latency: float = 0.0
    tp_redistribute_per_byte: float = 0.0
    """What DTensor adds to each sequence-parallel collective, `latency + per_byte * buffer bytes`: its
    host work, and the copies that gather or scatter along the sequence dimension of a [batch, sequence,
    hidden] tensor need around a collective that works along dim 0 (Megatron's [sequence, batch, hidden]
    needs none). `local` measures both (~0.5-0.8 ms and ~3 passes over the buffer here); 0 on GPUs, as
    for tp_kernel_overhead (not measured in this repo)."""
    reserved_bytes: float = 2.5 * GiB
    """Memory that is never the model's: CUDA context, NCCL buffers, cuBLAS workspaces."""
    allocator_slack: float = 0.0
    """Memory the allocator holds beyond what is live, as a fraction of the memory that comes and goes
    (activations, logits, buffers); 0: a GPU caching allocator's FRAGMENTATION (memory.py). `local`
    sets the measured one of glibc's malloc (local.LOCAL_ALLOCATOR_SLACK)."""
    peak_fp32_flops: float = 0.0
    """Peak for fp32 training; 0 means half the BF16 peak (the TF32 tensor-core rate on NVIDIA)."""
    peak_fp8_flops: float = 0.0
    """Dense FP8 peak, FLOP/s, for `--precision fp8` (Transformer Engine-style: GEMMs in FP8, attention,
    norms and master weights as in bf16); 0: the device has no FP8 tensor cores (A100, TPUs)."""
    power_watts: float = 0.0
    """Board power at full training load (the TDP: training holds GPUs at their power limit, see the
    matmul_efficiency note), watts; with the job's PUE it gives the energy of a run (energy.py)."""
    xla_step: int = 0
    """1: a training step on this device is one compiled XLA program (TPUs: JAX, as MaxText runs it), which
    holds memory and recomputes differently from eager PyTorch (planner/memory.py, compute.py; docs/planner.md,
    "TPUs run the step as one XLA program"): (a) XLA assigns every buffer at compile time and checks the
    largest set alive at any one point of the program ("the aggregate size of all necessary static
    allocations", openxla/xla docs/errors/error_1000.md), so the loss's vocabulary-wide tensors, freed before
    the layers' backward starts, are not counted beside a layer's gathered weights and recomputed activations;
    (b) FSDP gathers one scanned layer at a time, cast to bf16 before the gather, and reduces its gradients
    in bf16 before the cast back (MaxText's guides at e591f30c: docs/guides/optimization/custom_model.md,
    "a full, single layer of weights", "40GiB of bf16 weights and gradients" for 10B parameters;
    sharding.md, "All gather params ... (bf16)", gradient all-reduce "(bf16): 4 * params"); (c) `selective`
    is JAX's remat policy for it, MaxText's remat_policy=minimal (jax.checkpoint_policies.
    checkpoint_dots_with_no_batch_dims, later its explicit list of projection names, "save all except
    context", src/maxtext/layers/decoders.py): the weight matmuls' outputs are kept, the attention kernel's
    is not, so the attention forward runs again in backward; (d) `full` recomputes what the backward reads,
    the forward less the MLP's down-projection (compute.KernelTime.full_fwd). 0: eager PyTorch (GPUs)."""
    tp_overlap: float = 0.0
    """1: tensor-parallel collectives run beside the layer's matmuls, as XLA decomposes them into partial
    matmuls and collective-permutes (collective matmul: Wang et al., "Overlap Communication with Dependent
    Computation via Decomposition in Large Deep Learning Models", ASPLOS 2023), which MaxText turns on
    (--xla_tpu_enable_async_collective_fusion, --xla_tpu_overlap_compute_collective_tc in its v5p configs);
    0: they wait on the matmul that needs their result (NCCL under eager PyTorch)."""
    fp8_matmul_ratio: float = FP8_MATMUL_RATIO
    """The share of matmul_efficiency an FP8 GEMM keeps against the FP8 peak (FP8_MATMUL_RATIO)."""
    host_bandwidth: float = 25e9
    """Host<->device copy bandwidth, one direction, bytes/s, for offloading: a PCIe Gen4 x16 link moves
    ~25 GB/s of its 31.5 GB/s (A100 hosts); Gen5 x16 (H100/H200/B200 hosts) ~50 GB/s of 63 GB/s."""
    power_limit_watts: float = 0.0
    """A power cap below the TDP (nvidia-smi -pl), watts; 0: none. Under a cap the sustained clock, and
    with it every kernel's rate, drops as (limit / power_watts) ** POWER_CLOCK_EXPONENT (see
    `sustained_scale`); the energy uses the cap."""
    usd_per_gpu_hour: float = 0.0
    """On-demand cloud price per device-hour, USD, used when no --usd-per-gpu-hour is given (0: none).
    List prices move; these are approximate public 2024 rates, a default to overwrite, not a quote."""
    flash2_attention_efficiency: float = 0.0
    """attention_efficiency of FlashAttention-2 where it is not the device's own kernel (`--attention
    flash2`): on Hopper it uses none of the chip's asynchronous tensor-core instructions. What PyTorch's
    SDPA runs by default there (its FLASH backend), and so torchtitan. 0: attention_efficiency."""
    attention_score_cost: float = 0.0
    """What the non-matmul work of one attention score costs, forward and backward together (the
    exponentials of the softmax and its recomputation, the softmax gradient), in FLOPs at the bf16 peak.
    Its share grows as the head dimension shrinks (the matmuls do 14·head_dim FLOPs per score), which is
    why attention at head dim 64 reaches less of the peak than at 128 (attention_time). 0: none counted."""
    note: str = ""
    """Where the numbers come from."""

    @property
    def sustained_scale(self) -> float:
        """Fraction of the catalog's sustained rates left under power_limit_watts (1.0 without a cap)."""
        if not self.power_limit_watts or not self.power_watts or self.power_limit_watts >= self.power_watts:
            return 1.0
        return (self.power_limit_watts / self.power_watts) ** POWER_CLOCK_EXPONENT

    @property
    def board_watts(self) -> float:
        """What one device draws while training: its cap if it has one, else its TDP."""
        return min(self.power_watts, self.power_limit_watts) if self.power_limit_watts else self.power_watts

    @property
    def intra_busbw(self) -> float:
        return self.intra_node_bandwidth * self.intra_node_efficiency

    @property
    def inter_busbw(self) -> float:
        return self.inter_node_bandwidth * self.inter_node_efficiency

    def peak_flops(self, precision: str = "bf16") -> float:
        """The tensor-core peak the GEMMs of this precision run against."""
        if precision == "fp32":
            return self.peak_fp32_flops or self.peak_bf16_flops / 2
        if precision == "fp8":
            return self.peak_fp8_flops
        return self.peak_bf16_flops

    def matmul_rate(self, precision: str = "bf16") -> float:
        """FLOP/s a large GEMM sustains in training at this precision (the power cap included)."""
        ratio = self.fp8_matmul_ratio if precision == "fp8" else 1.0
        return self.peak_flops(precision) * self.matmul_efficiency * ratio * self.sustained_scale

    def mfu_peak(self, precision: str = "bf16") -> float:
        """MFU's denominator: the dense BF16 peak, also for FP8 runs (Llama 3's "BF16 MFU"; torchtitan and
        Megatron report FP8 runs against it too), and the fp32 peak for fp32 training."""
        return self.peak_flops("fp32" if precision == "fp32" else "bf16")
