"""The hardware catalog: the accelerators the planner knows by name, each a `GPU` record (gpu.py has its
fields; TPUs and the local CPU included, "GPU" here means "one rank's device"), with the sources of its numbers
and the measurements behind its `*_efficiency` fields beside it. Entries can be changed with `--hw FIELD=VALUE`
or a TOML file (`--hw-file`), see overrides.py and lookup.load_hw_file. The measured `local` entry (this
machine) is local.py; lookup.py finds an entry by the name a user gives.
"""

from __future__ import annotations

import dataclasses

from shoal.hardware.gpu import GPU, GiB


B200_FP8_MATMUL_RATIO = 0.763 / 0.776
"""ml-engineering's MAMF table (gpu.FP8_MATMUL_RATIO's) for B200: FP8 76.3% against BF16 77.6% of their peaks: Blackwell's FP8 GEMMs keep
nearly the BF16 share (0.98), so B200, GB200 and GB300 take their own ratio, not H200's."""


TPU_RUNTIME_BYTES = 0.75 * GiB
"""What a TPU's runtime keeps of its HBM (TPUs have no CUDA context, NCCL buffers or cuBLAS workspaces,
reserved_bytes' GPU default): a v6e reports 33,550,237,696 of its 32 GiB to a program (vLLM's usage stats,
vllm-project/vllm#16211), 0.75 GiB less; a v4 30.75-31.75 GiB of 32 (jax-ml/jax#1491, pytorch/xla#7086).
TPU HBM sizes are GiB (16, 32, 95: vllm-project/tpu-inference#753's device table). Used for v5e and v6e; v5p
and v4 take the limit XLA itself reports compiling against (TPU_V5P_XLA_LIMIT, TPU_V4_XLA_LIMIT)."""

TPU_V5P_XLA_LIMIT = 95.74 * GiB
"""What XLA:TPU compiles a v5p program against, its runtime's reserve already taken off: its out-of-memory
reports read "Used X of 95.74G hbm" (a 25B model on v5p-64: "Used 110.81G of 95.74G hbm"; XLA's own page
for the error, openxla/xla docs/errors/error_1000.md: "exceeding available bytes: 95.74G"). So tpu-v5p's
hbm_bytes is that limit and its reserved_bytes 0 (the chip's size and its reserve apart are not published;
vllm-project/tpu-inference#753's 95 GiB is a budget hard-coded below it)."""

TPU_V4_XLA_LIMIT = 30.75 * GiB
"""The same on a v4: MaxText's 52B on v4-384 "fails with an HBM OOM during compilation (Used 33.27G of
30.75G)" (AI-Hypercomputer/maxtext#4117), and JAX reports the same bytes_limit, 33,014,415,360
(jax-ml/jax#1491)."""

XLA_BUFFER_SLACK = 0.004
"""allocator_slack of a device whose step is one XLA program (`xla_step`): XLA lays out every temporary
buffer at compile time, so what the caching allocator of eager PyTorch loses to fragmentation is not lost
here. XLA:TPU's own out-of-memory reports give its layout's loss as 0.4% of the program's temporaries
("HLO temp 14.31G (100.0% utilization ... 0.4% fragmentation (62.60M))", erfanzar/EasyDeL#142; "HLO temp
3.93G (97.4% utilization: Unpadded (3.81G) Padded (3.92G), 0.4% fragmentation (14.68M))", pytorch/xla#1735,
whose 2.6% more is padding of dimensions that are not multiples of 8 x 128, which the models planned here
do not have)."""


# Matmul efficiency is the *sustained* rate (ml-engineering's MSMF: power-saturated clocks, all GPUs of
# the node busy): H200 ~703-727 TFLOP/s of 989 (0.71-0.735) and B200 ~1430-1456 of 2250 (0.64), while
# short bursts reach 80-84% (MAMF; this project measured 81% on one H100, 80% on one H200). H100 has
# H200's die and power limit, so 0.72 too. A100 has no sustained measurement: its burst MAMF (85.9%)
# times the sustained/burst ratio seen on H200 and B200 (~0.85) gives 0.73 (that product, not a fit; it
# happens to land within 1% of one Korthikanti layer time). MI300X saturates its power cap within one
# kernel, so its MAMF (60%) is already sustained.
#
# NVLink bus efficiency from nccl-tests all_reduce on 8-GPU NVSwitch nodes (~235 GB/s on A100, ~360 GB/s
# on H100 without NVLS). Inter-node efficiency 0.9: nccl-tests across nodes with one NIC per GPU reports
# busbw near 90% of line rate (~22-23 GB/s per GPU of HDR's 25; approximate).
#
# HBM efficiency from the copy measurements in calibration.md (3.0 of 3.35 TB/s on H100, 4.3 of 4.8 TB/s
# on H200); A100's 0.85 and the others' are not measured here: STREAM/BabelStream-class copies reach
# 85-90% of datasheet bandwidth on HBM parts, 0.85 the lower end (approximate).
#
# Attention efficiency, in FlashAttention's own FLOP count (causal = half, backward 2.5x forward), forward
# and backward together, at head dim 128:
# - A100: FlashAttention-2, its own kernel, reaches 50-73% of the peak forward and less backward (Dao 2023,
#   arXiv:2307.08691, abstract and its A100 benchmarks, fwd+bwd ~170-190 TFLOP/s), so 0.55.
# - H100 and H200 (one die), measured on an H200 here (bench/gpu_kernels.py, docs/measurements/
#   h200-kernels.json; 4-32 heads, 4,096-8,192 tokens, GQA and MQA): cuDNN's kernel 0.47-0.52, so 0.49;
#   FlashAttention-2 (SDPA's FLASH backend) 0.27-0.30, so 0.28. FlashAttention-3's paper has the same
#   split (Shah et al. 2024, arXiv:2407.08608: FA2 "only 35%" forward, FA3 up to 75% forward) and
#   pytorch/pytorch#142132 measured SDPA's default at 329 TFLOP/s forward against cuDNN's and FA3's 631.
# - B200 has no measurement read here: Hopper's two shares are assumed (approximate; cuDNN is B200's own
#   kernel, torchtitan's pytorch/torchtitan#1196). MI300X and the older parts keep one share (approximate).
# Score cost (attention_score_cost): at head dim 64 the same H200 kernels reach 0.37 (cuDNN) and 0.24
# (FA2), against 0.47 and 0.27 at 128 on the same shapes. Time per score = 14·d / (peak · e) + c fits both
# kernels with c = 0.94-1.00 ps per score, i.e. ~955 FLOPs at 989 TFLOP/s: about four special-function
# operations per score (132 SMs x 16 per clock x 1.98 GHz = 4.2e12/s), the exponentials forward and
# again in backward. Other GPUs scale that by their peak over their special-function rate (SMs x 16 x
# boost clock, the vendors' datasheets): A100 108 x 16 x 1.41 GHz, 312 TFLOP/s: 517; B200 148 x 16 x
# 1.965 GHz, 2250 TFLOP/s: 1950 (derived, not measured). Where no rate is known: 0 (no head-dim term).
#
# FP8 dense peaks (the vendors' datasheets, without sparsity): H100 SXM and H200 1979 TFLOP/s, B200 4.5
# PFLOP/s, MI300X 2614.9 TFLOP/s; A100 and the TPUs here have no FP8 tensor cores.
#
# Power (board TDP, the vendors' datasheets): A100 SXM 400 W, H100 SXM and H200 SXM 700 W, B200 1000 W,
# MI300X 750 W. TPUs have no published TDP: v4 ~200 W is the mean power per chip reported in Jouppi et
# al., "TPU v4" (ISCA 2023, ~170-192 W measured); v5p 450 W is a guess scaled by peak FLOPs (approximate).
#
# Two older parts that published runs used (their "bf16" below is the 16-bit tensor peak: V100 has fp16 only):
# - V100 SXM2 32GB (NVIDIA V100 datasheet): 125 TFLOP/s fp16 tensor, 15.7 TFLOP/s fp32 (no TF32), 900 GB/s
#   HBM2, six NVLink2 links of 25 GB/s per direction, 300 W. DGX-1: 8 GPUs in a hybrid cube-mesh (not every
#   pair linked, so rings reach less of the links: 0.7, approximate) and 4x100 Gb/s EDR InfiniBand per node,
#   6.25 GB/s per GPU. Matmul efficiency 0.70 is approximate, not measured here: a whole 1.2B model trained
#   at 48% of peak end to end on one DGX-2H V100 (NVIDIA ADLR, "MegatronLM's Supercharged V1.0", 2019), so
#   its GEMMs ran well above that; A100's 0.73 less a little. Volta has no FlashAttention-2 (sm80+): runs of
#   its era are unfused (--attention unfused); the flash entry is memory-efficient attention, approximate.
# - MI250X, one GCD (each of its two dies is its own device to torch and to published MFU; OLCF's Frontier
#   user guide): 191.5 TFLOP/s bf16 (383 per package), 47.9 fp32 matrix, 64 GB HBM2e at 1.64 TB/s. A
#   Frontier or LUMI node is 4 packages = 8 GCDs; GCDs on different packages are linked at 50-100 GB/s
#   (200 GB/s within a package), so a ring over 8 moves at the slowest hop's 50 GB/s; four 200 Gb/s
#   Slingshot NICs per node, 12.5 GB/s per GCD. 280 W: half the package's 560 W. Matmul efficiency is
#   MI300X's measured 0.60 (approximate: CDNA2 was not measured here; Frontier's 22B run reached 38% MFU
#   end to end, Dash et al. 2023, arXiv:2312.12705, abstract).
#
# TPUs (How To Scale Your Model, jax-ml/scaling-book, "TPUs" chapter, its chip and ICI tables; Cloud TPU v5p and
# v5e docs): v5p 459 TFLOP/s bf16, 95 GB HBM at 2.8 TB/s, 3D torus, 9e10 bytes/s each way per ICI link; v5e 197
# TFLOP/s, 16 GB at 819 GB/s, 2D 16x16 torus, 4.5e10 per link. A ring along one torus axis sends both ways, so
# intra_node_bandwidth is the per-axis 1.8e11 (v5p) / 9e10 (v5e) and a group spans one or more axes
# (planner/torus.py). Efficiency 0.8: the same chapter's profiled all-gather on a v5e 4x4 took 680 us against
# 560 us at the link rate (0.82, one measurement, approximate). Hop latency ~1 us ("A note on ICI latency").
# DCN between slices ~2.5e10 bytes/s per host (same chapter), a host serving 4 v5p or 8 v5e chips.
# Matmul efficiency 0.85, derived: a TPU runs its systolic arrays at a fixed clock from VMEM that the compiler
# pipelines against HBM, and device-timed large GEMMs reach 90%+ of peak (TPU v6e, trace-timed: yangwhale/
# gpu-tpu-pedia tpu/v7_perf/README.md; TPU v2: 96 ms against 95.6 ms at peak in the scaling book's "Profiling"
# chapter); MaxText's 512B model with full rematerialisation on v5p-1024 runs 64.0% MFU = 85.3% of peak in
# executed FLOPs (recompute adds a third), a floor that attention and element-wise work sit inside of.
# 0.85 is that floor (not a fit: the rows with lighter remat are not consulted); v5e takes its own by the same
# rule (TPU_V5E_MATMUL_FLOOR). TPU v4 (same chapter's tables:
# 275 TFLOP/s, 32 GB at 1.2 TB/s, 4.5e10 per link one way, 16x16x16 pods of 4x4x4 cubes, 4 chips per host) gets
# the same torus. Its matmul efficiency stays the unsourced 0.75: the floor above is v5p's own, and v4's only
# published full-remat run (PaLM, 57.8% HFU) sets none above it. (Read after the fact: 0.85 would put the
# held-out PaLM row at +13%, 0.75 at +1.5%; so that row no longer tests v4's efficiency.)
# Prices (on-demand, USD per device-hour, 2024, approximate): Lambda's public list, A100 SXM 80GB 1.79
# and H100 SXM 2.99; H200 3.50, B200 5.99 and MI300X 2.50 are typical neocloud quotes of 2024-25
# (approximate); Google Cloud's list price per chip-hour, TPU v4 3.22 and v5p 4.20.
TPU_V5E_MATMUL_FLOOR = 132 / 197 * 4 / 3
"""v5e's sustained matmul share, the v5p rule applied to v5e's own published run: MaxText's 32B model on one
v5e-256 slice with full rematerialisation reports 132 model TFLOP/s per chip (configs/v5e/README.md at 76bd53b0,
32b.sh), 67.0% of 197, so 89.3% of peak in executed FLOPs; its GEMMs run at least that fast, since attention
and element-wise work sit inside it. (Its 16B and 64B rows, 81% and 80% executed, bound it less.)"""


CATALOG: dict[str, GPU] = {
    "a100-80gb": GPU(
        name="a100-80gb", peak_bf16_flops=312e12, matmul_efficiency=0.73, attention_efficiency=0.55,
        attention_score_cost=517,
        hbm_bytes=80 * GiB, hbm_bandwidth=2.039e12, hbm_efficiency=0.85,
        gpus_per_node=8, intra_node_bandwidth=300e9, intra_node_efficiency=0.78, intra_node_latency=5e-6,
        inter_node_bandwidth=25e9, inter_node_efficiency=0.9, inter_node_latency=10e-6,
        power_watts=400, usd_per_gpu_hour=1.79,
        note="DGX A100: NVLink3 600 GB/s bidirectional, one 200 Gb/s HDR InfiniBand NIC per GPU (Selene)"),
    "h100-sxm": GPU(
        name="h100-sxm", peak_bf16_flops=989e12, matmul_efficiency=0.72, attention_efficiency=0.49,
        flash2_attention_efficiency=0.28, attention_score_cost=955,
        hbm_bytes=81559 * 2**20, hbm_bandwidth=3.35e12, hbm_efficiency=0.9,
        gpus_per_node=8, intra_node_bandwidth=450e9, intra_node_efficiency=0.8, intra_node_latency=5e-6,
        inter_node_bandwidth=50e9, inter_node_efficiency=0.9, inter_node_latency=10e-6,
        peak_fp8_flops=1979e12, power_watts=700, usd_per_gpu_hour=2.99,
        note="HGX H100: NVLink4 900 GB/s bidirectional, one 400 Gb/s NDR InfiniBand/RoCE NIC per GPU", host_bandwidth=50e9),
    "h200": GPU(
        name="h200", peak_bf16_flops=989e12, matmul_efficiency=0.72, attention_efficiency=0.49,
        flash2_attention_efficiency=0.28, attention_score_cost=955,
        hbm_bytes=143771 * 2**20, hbm_bandwidth=4.8e12, hbm_efficiency=0.9,
        gpus_per_node=8, intra_node_bandwidth=450e9, intra_node_efficiency=0.8, intra_node_latency=5e-6,
        inter_node_bandwidth=50e9, inter_node_efficiency=0.9, inter_node_latency=10e-6,
        peak_fp8_flops=1979e12, power_watts=700, usd_per_gpu_hour=3.50,
        note="HGX H200: H100 compute with 141 GB HBM3e; 400 Gb/s per GPU between nodes", host_bandwidth=50e9),
    "b200": GPU(
        name="b200", peak_bf16_flops=2250e12, matmul_efficiency=0.64, fp8_matmul_ratio=B200_FP8_MATMUL_RATIO,
        attention_efficiency=0.49,
        flash2_attention_efficiency=0.28, attention_score_cost=1950,
        hbm_bytes=180 * GiB, hbm_bandwidth=8.0e12, hbm_efficiency=0.85,
        gpus_per_node=8, intra_node_bandwidth=900e9, intra_node_efficiency=0.8, intra_node_latency=5e-6,
        inter_node_bandwidth=50e9, inter_node_efficiency=0.9, inter_node_latency=10e-6,
        peak_fp8_flops=4500e12, power_watts=1000, usd_per_gpu_hour=5.99,
        note="HGX B200: NVLink5 1.8 TB/s bidirectional, 400 Gb/s per GPU between nodes; ~180 GiB usable", host_bandwidth=50e9),
    "mi300x": GPU(
        name="mi300x", peak_bf16_flops=1307e12, matmul_efficiency=0.60, attention_efficiency=0.35,
        hbm_bytes=192 * GiB, hbm_bandwidth=5.3e12, hbm_efficiency=0.8,
        gpus_per_node=8, intra_node_bandwidth=448e9, intra_node_efficiency=0.7, intra_node_latency=8e-6,
        inter_node_bandwidth=50e9, inter_node_efficiency=0.85, inter_node_latency=12e-6,
        peak_fp8_flops=2615e12, power_watts=750, usd_per_gpu_hour=2.50, fabric="Infinity Fabric",
        note="8x MI300X: Infinity Fabric 7 x 64 GB/s per direction to peers, 400 Gb/s per GPU between nodes"),
    "v100": GPU(
        name="v100", peak_bf16_flops=125e12, peak_fp32_flops=15.7e12, matmul_efficiency=0.70,
        attention_efficiency=0.3, hbm_bytes=32 * GiB, hbm_bandwidth=900e9, hbm_efficiency=0.85,
        gpus_per_node=8, intra_node_bandwidth=150e9, intra_node_efficiency=0.7, intra_node_latency=5e-6,
        inter_node_bandwidth=6.25e9, inter_node_efficiency=0.9, inter_node_latency=10e-6,
        power_watts=300,
        note="DGX-1 V100 SXM2 32GB: fp16 tensor cores (no bf16), NVLink2 cube-mesh, 4x100 Gb/s EDR per node"),
    "mi250x": GPU(
        name="mi250x", peak_bf16_flops=191.5e12, peak_fp32_flops=47.9e12, matmul_efficiency=0.60,
        attention_efficiency=0.3, hbm_bytes=64 * GiB, hbm_bandwidth=1.6384e12, hbm_efficiency=0.8,
        gpus_per_node=8, intra_node_bandwidth=50e9, intra_node_efficiency=0.7, intra_node_latency=8e-6,
        inter_node_bandwidth=12.5e9, inter_node_efficiency=0.85, inter_node_latency=12e-6,
        power_watts=280, fabric="Infinity Fabric",
        note="one MI250X GCD (Frontier/LUMI node: 8 GCDs, Infinity Fabric 50-200 GB/s, 4x200 Gb/s Slingshot)"),
    "tpu-v5p": GPU(
        name="tpu-v5p", peak_bf16_flops=459e12, matmul_efficiency=0.85, attention_efficiency=0.5,
        hbm_bytes=TPU_V5P_XLA_LIMIT, reserved_bytes=0.0, hbm_bandwidth=2.765e12, hbm_efficiency=0.85,
        xla_step=1, fabric="ICI", allocator_slack=XLA_BUFFER_SLACK,
        gpus_per_node=8960, torus_dims=3, intra_node_bandwidth=180e9, intra_node_efficiency=0.8,
        intra_node_latency=1e-6, inter_node_bandwidth=6.25e9, inter_node_efficiency=0.7, inter_node_latency=10e-6,
        power_watts=450, usd_per_gpu_hour=4.20, tp_overlap=1.0,
        note="TPU v5p: a pod is one 3D ICI torus (16x20x28 = 8960 chips), 90 GB/s each way on each of its 6 "
             "links; slices joined over the data-centre network (DCN)"),
    "tpu-v5e": GPU(
        name="tpu-v5e", peak_bf16_flops=197e12, matmul_efficiency=TPU_V5E_MATMUL_FLOOR, attention_efficiency=0.5,
        hbm_bytes=16 * GiB, reserved_bytes=TPU_RUNTIME_BYTES, hbm_bandwidth=819e9, hbm_efficiency=0.85,
        xla_step=1, fabric="ICI", allocator_slack=XLA_BUFFER_SLACK,
        gpus_per_node=256, torus_dims=2, torus_wrap_side=16, intra_node_bandwidth=90e9, intra_node_efficiency=0.8,
        intra_node_latency=1e-6, inter_node_bandwidth=3.125e9, inter_node_efficiency=0.7, inter_node_latency=10e-6,
        usd_per_gpu_hour=1.20, tp_overlap=1.0,
        note="TPU v5e: a pod is one 16x16 2D ICI torus, 45 GB/s each way on each of its 4 links; pods joined over DCN"),
    "tpu-v4": GPU(
        name="tpu-v4", peak_bf16_flops=275e12, matmul_efficiency=0.75, attention_efficiency=0.5,
        hbm_bytes=TPU_V4_XLA_LIMIT, reserved_bytes=0.0, hbm_bandwidth=1.2e12, hbm_efficiency=0.85,
        xla_step=1, fabric="ICI", allocator_slack=XLA_BUFFER_SLACK,
        gpus_per_node=4096, torus_dims=3, intra_node_bandwidth=90e9, intra_node_efficiency=0.8,
        intra_node_latency=1e-6, inter_node_bandwidth=6.25e9, inter_node_efficiency=0.7, inter_node_latency=10e-6,
        power_watts=200, usd_per_gpu_hour=3.22, tp_overlap=1.0,
        note="TPU v4: a pod is one 3D ICI torus (16x16x16 = 4096 chips), 45 GB/s each way on each of its 6 "
             "links; pods joined over DCN"),
}

# Newer parts, from the vendors' pages (matmul and attention shares are their generation's, approximate):
# - GB200 and GB300 in NVL72 racks: 72 GPUs on one NVLink 5 switch fabric (900 GB/s each way per GPU), so
#   the "node" is the rack's NVLink domain, 72 GPUs; a job of 128, 256... GPUs fills 64 of each (ranks fill
#   nodes evenly: planner/workload.py Cluster). NVIDIA's GB200 NVL72 page: 360 PFLOP/s FP16/BF16 with sparsity per rack, 2.5
#   dense per GPU (FP8 5), 13.4 TB of HBM3e (186 GB per GPU) at 8 TB/s, ConnectX-7 400 Gb/s per GPU between
#   racks; GB300 NVL72: the same BF16 rate, 279 GB of HBM3e per GPU, ConnectX-8 800 Gb/s. Board power
#   1.2 and 1.4 kW. The host is the superchip's Grace CPU, on NVLink-C2C at 900 GB/s both ways for its two
#   GPUs (NVIDIA's GB200 pages), so a GPU copies to it at 225 GB/s each way (host_bandwidth), not over PCIe.
#   Matmul efficiency as B200's sustained 0.64; attention as B200's (Hopper's measured shares), its per-score
#   cost from the special-function rate, 5 (GB200) and 10.7 (GB300) tera-exponentials/s against 2.5 PFLOP/s:
#   1816 and 849 by the H200's 955 at 989 / 4.18.
# - TPU v6e (Trillium), Google Cloud's "TPU v6e" page: 918 TFLOP/s BF16, 32 GB at 1,638 GB/s, 800 GB/s of
#   ICI per chip both ways over 4 ports (v5e's 400 doubled), 256-chip pods in a 16x16 2D torus as v5e's;
#   the page gives no NIC figure: v5e's per-chip DCN rate doubled, approximate. Matmul efficiency as
#   tpu-v5e's (unmeasured for this chip).
# - B300 (HGX B300, Blackwell Ultra in 8-GPU NVLink 5 nodes on PCIe hosts): B200's dense BF16/FP8 rates and
#   matmul shares, GB300's memory, attention exponent rate and ConnectX-8 NICs, 1.1 kW; approximate (no
#   datasheet figure read here gives its dense BF16 rate apart from GB300's).
# - MI325X (AMD's datasheet): MI300X's compute (1307 TFLOP/s BF16, 2615 FP8) with 256 GB of HBM3e at
#   6 TB/s, 1000 W.
CATALOG["gb200"] = dataclasses.replace(
    CATALOG["b200"], name="gb200", peak_bf16_flops=2500e12, peak_fp8_flops=5000e12, hbm_bytes=186e9,
    gpus_per_node=72, attention_score_cost=1816, power_watts=1200, usd_per_gpu_hour=0.0, host_bandwidth=225e9,
    note="GB200 NVL72: 72 Blackwell GPUs on NVLink 5 (1.8 TB/s bidirectional each), 400 Gb/s per GPU between racks")


def _faster_exponentials(base: GPU, score_cost: float) -> dict:
    """The attention fields of `base`'s die with a faster special-function unit: the per-score cost beside
    the matmuls falls to `score_cost` and the share kept at head dim 128 rises with it, since that share
    was `base`'s with its own cost in it (compute.attention_rate: a score there takes 1792/efficiency
    peak-FLOP times, attention_score_cost of them outside the matmuls)."""
    per_score = 14 * 128 / base.attention_efficiency - base.attention_score_cost + score_cost
    return dict(attention_score_cost=score_cost, attention_efficiency=14 * 128 / per_score)


CATALOG["gb300"] = dataclasses.replace(
    CATALOG["gb200"], name="gb300", hbm_bytes=279e9, inter_node_bandwidth=100e9,
    **_faster_exponentials(CATALOG["gb200"], 849), power_watts=1400,
    note="GB300 NVL72: Blackwell Ultra, 279 GB HBM3e per GPU, 800 Gb/s per GPU between racks")
CATALOG["b300"] = dataclasses.replace(
    CATALOG["b200"], name="b300", hbm_bytes=CATALOG["gb300"].hbm_bytes, inter_node_bandwidth=100e9,
    **_faster_exponentials(CATALOG["b200"], CATALOG["gb300"].attention_score_cost), power_watts=1100,
    note="HGX B300: Blackwell Ultra in 8-GPU nodes, B200's dense rates, 279 GB HBM3e, 800 Gb/s per GPU "
         "(approximate)")
CATALOG["tpu-v6e"] = dataclasses.replace(
    CATALOG["tpu-v5e"], name="tpu-v6e", peak_bf16_flops=918e12, hbm_bytes=32 * GiB, hbm_bandwidth=1638e9,
    intra_node_bandwidth=180e9, inter_node_bandwidth=6.25e9, usd_per_gpu_hour=0.0,
    note="TPU v6e (Trillium): a pod is one 16x16 2D ICI torus, twice v5e's ICI per link; pods joined over DCN")
CATALOG["mi325x"] = dataclasses.replace(
    CATALOG["mi300x"], name="mi325x", hbm_bytes=256e9, hbm_bandwidth=6.0e12, power_watts=1000, usd_per_gpu_hour=0.0,
    note="8x MI325X: MI300X compute with 256 GB HBM3e at 6 TB/s")

# Variants of three entries, from the datasheets: A100 SXM 40GB has HBM2 at 1,555 GB/s (the 80GB's 2,039;
# many 2022-23 runs used it); H800 SXM and A800 SXM are H100 SXM and A100 SXM 80GB with NVLink cut to 400 GB/s
# bidirectional (the export variants several published Chinese runs trained on).
CATALOG["a100-40gb"] = dataclasses.replace(
    CATALOG["a100-80gb"], name="a100-40gb", hbm_bytes=40 * GiB, hbm_bandwidth=1.555e12, usd_per_gpu_hour=0.0,
    note="DGX A100 40GB: as a100-80gb with 40 GB of HBM2 at 1.555 TB/s")
CATALOG["h800"] = dataclasses.replace(
    CATALOG["h100-sxm"], name="h800", intra_node_bandwidth=200e9, usd_per_gpu_hour=0.0,
    note="HGX H800: H100 SXM compute and memory, NVLink 400 GB/s bidirectional, 400 Gb/s per GPU between nodes")
CATALOG["a800"] = dataclasses.replace(
    CATALOG["a100-80gb"], name="a800", intra_node_bandwidth=200e9, usd_per_gpu_hour=0.0,
    note="HGX A800 80GB: A100 SXM compute and memory, NVLink 400 GB/s bidirectional, 200 Gb/s per GPU between nodes")

# TPU v3, Google Cloud's "TPU v3" page: 123 TFLOP/s BF16 and 32 GiB of HBM2 at 900 GB/s per chip (two
# TensorCores, planned as one device like the later chips' megacore), 262 W measured maximum, 1,024-chip pods
# in a 2D torus (32 x 32; only a full axis wraps, as on v5e), 340 TB/s of all-reduce bandwidth per pod: 166 GB/s
# per chip and torus axis (v4's page gives 1.1 PB/s over 4,096 chips and 3 axes, 90 GB/s, the v4 entry's).
# XLA's usable share of HBM and the matmul share are v4's, the DCN rate v4's (approximate: no v3 figure read here).
CATALOG["tpu-v3"] = dataclasses.replace(
    CATALOG["tpu-v4"], name="tpu-v3", peak_bf16_flops=123e12, hbm_bytes=TPU_V4_XLA_LIMIT, hbm_bandwidth=900e9,
    gpus_per_node=1024, torus_dims=2, torus_wrap_side=32, intra_node_bandwidth=166e9, power_watts=262,
    usd_per_gpu_hour=0.0,
    note="TPU v3: a pod is one 32x32 2D ICI torus (1,024 chips of two TensorCores); pods joined over DCN")

# Parts people train on that no published run in bench/ used; every figure is the vendor's datasheet unless it
# says otherwise, every efficiency its generation's above (approximate: none measured on these parts):
# - H100 PCIe (H100 datasheet): 756 TFLOP/s BF16 and 1,513 FP8 dense, 80 GB HBM2e at 2.0 TB/s, 350 W. H100 NVL:
#   835 and 1,671, 94 GB HBM3 at 3.9 TB/s, 400 W. Both sit 8 to a server on PCIe Gen5 x16 (64 GB/s each way;
#   the NVLink bridges join pairs only, so a ring over 8 moves at PCIe's pace) with one 200 Gb/s NIC per GPU.
#   Their per-score cost is the H200's rule with their SM counts and boost clocks (114 at 1.755 GHz, 132 at
#   1.785 GHz).
# - H20 (HGX H20): 148 TFLOP/s BF16 and 296 FP8 dense, 96 GB HBM3 at 4.0 TB/s, NVLink 900 GB/s both ways,
#   400 W; the per-score cost is unknown (no SM count published), so none.
# - L40S (L40S datasheet): 362 TFLOP/s BF16 and 733 FP8 dense, 48 GB GDDR6 at 864 GB/s, 350 W, PCIe Gen4 x16
#   (32 GB/s each way), no NVLink; 200 Gb/s per GPU in NVIDIA's OVX servers. Ada runs FlashAttention-2, not
#   Hopper's kernels: A100's FlashAttention-2 share.
# - MI250 (AMD's datasheet), one GCD as mi250x: 362.1 TFLOP/s BF16 per package (181 per GCD), 64 GB and
#   1.6 TB/s per GCD, 500 W per package.
# - MI355X and MI350X (AMD's datasheet): 2.5 and 2.3 PFLOP/s BF16 dense (FP8 twice that), 288 GB HBM3E at
#   8 TB/s, Infinity Fabric 7 x 153.6 GB/s both ways, 1,400 W (liquid) and 1,000 W (air); 400 Gb/s per GPU.
# - Gaudi 2 and Gaudi 3 (Intel's datasheets): 432 and 1,835 TFLOP/s BF16 (FP8 865 and 1,835), 96 GB HBM2e at
#   2.45 TB/s and 128 GB at 3.7 TB/s, 600 W and 900 W. Each has 24 RoCE ports on the chip (100 and 200 Gb/s):
#   21 join the 8 cards of a node all-to-all (262.5 and 525 GB/s each way per card), 3 leave it (37.5 and 75
#   GB/s). The matmul and attention shares are MI300X's (approximate: no sustained GEMM figure read here).
# - TPU v7 (Ironwood, Google Cloud's page): 4,614 TFLOP/s FP8, 192 GiB HBM at 7.37 TB/s, 9,216-chip pods in a
#   3D torus, 1.2 TB/s of ICI per chip both ways, twice v5p's 600 GB/s on the same page, so twice v5p's
#   per-axis rate here. Its BF16 rate is not published: half the FP8 one, as on every chip with both
#   (approximate). The matmul share is v5p's floor, the rest v5p's.
# - V100 SXM2 16GB: the v100 entry with 16 GB (the DGX-1 of 2017-18).
# HBM sizes are GiB (stacks of 16, 24 or 36 GiB); L40S's GDDR6 is what nvidia-smi reports, 46,068 MiB.
def _h100_on_pcie(name: str, bf16: float, score: float, hbm_bytes: float, hbm_bandwidth: float, watts: float) -> GPU:
    """An H100 on a PCIe host: its own peak (FP8 twice it), memory and power; 8 to a server on PCIe Gen5 with one
    200 Gb/s NIC a GPU (the NVLink bridges join pairs only, so a ring over 8 moves at PCIe's pace)."""
    return dataclasses.replace(
        CATALOG["h100-sxm"], name=name, peak_bf16_flops=bf16, peak_fp8_flops=2 * bf16, attention_score_cost=score,
        hbm_bytes=hbm_bytes, hbm_bandwidth=hbm_bandwidth, power_watts=watts, fabric="PCIe", gpus_per_node=8,
        intra_node_bandwidth=64e9, intra_node_efficiency=0.7, inter_node_bandwidth=25e9, usd_per_gpu_hour=0.0,
        note=f"8 x {name.upper()} on PCIe Gen5 (NVLink bridges pair them only), 200 Gb/s per GPU between nodes")


CATALOG["h100-pcie"] = _h100_on_pcie("h100-pcie", 756e12, 945, CATALOG["h100-sxm"].hbm_bytes, 2.0e12, 350)
CATALOG["h100-nvl"] = _h100_on_pcie("h100-nvl", 835e12, 886, 94 * GiB, 3.9e12, 400)
CATALOG["h20"] = dataclasses.replace(
    CATALOG["h100-sxm"], name="h20", peak_bf16_flops=148e12, peak_fp8_flops=296e12, attention_score_cost=0,
    hbm_bytes=96 * GiB, hbm_bandwidth=4.0e12, power_watts=400, usd_per_gpu_hour=0.0,
    note="HGX H20: Hopper cut to 148 TFLOP/s BF16, 96 GB HBM3 at 4 TB/s, NVLink 900 GB/s, 400 Gb/s per GPU")
CATALOG["l40s"] = dataclasses.replace(
    CATALOG["a100-80gb"], name="l40s", peak_bf16_flops=362e12, peak_fp8_flops=733e12, attention_score_cost=0,
    hbm_bytes=46068 * 2**20, hbm_bandwidth=864e9, intra_node_bandwidth=32e9, intra_node_efficiency=0.7,
    power_watts=350, fabric="PCIe", usd_per_gpu_hour=0.0,
    note="8 x L40S 48GB GDDR6 on PCIe Gen4, no NVLink, 200 Gb/s per GPU between nodes")
CATALOG["mi250"] = dataclasses.replace(
    CATALOG["mi250x"], name="mi250", peak_bf16_flops=181e12, peak_fp32_flops=45.3e12, power_watts=250,
    note="one MI250 GCD (4 packages = 8 GCDs a node on Infinity Fabric)")
CATALOG["mi355x"] = dataclasses.replace(
    CATALOG["mi300x"], name="mi355x", peak_bf16_flops=2500e12, peak_fp8_flops=5000e12, hbm_bytes=288 * GiB,
    hbm_bandwidth=8.0e12, intra_node_bandwidth=537.6e9, power_watts=1400, usd_per_gpu_hour=0.0,
    note="8x MI355X: Infinity Fabric 7 x 76.8 GB/s per direction to peers, 400 Gb/s per GPU between nodes")
CATALOG["mi350x"] = dataclasses.replace(
    CATALOG["mi355x"], name="mi350x", peak_bf16_flops=2300e12, peak_fp8_flops=4600e12, power_watts=1000,
    note="8x MI350X (air-cooled MI355X, lower clocks): Infinity Fabric 7 x 76.8 GB/s per direction to peers")
CATALOG["gaudi2"] = dataclasses.replace(
    CATALOG["mi300x"], name="gaudi2", peak_bf16_flops=432e12, peak_fp8_flops=865e12, hbm_bytes=96 * GiB,
    hbm_bandwidth=2.45e12, intra_node_bandwidth=262.5e9, inter_node_bandwidth=37.5e9, power_watts=600,
    fabric="RoCE", usd_per_gpu_hour=0.0,
    note="8x Gaudi 2: 21 on-chip 100 GbE RoCE ports join the node all-to-all, 3 (300 Gb/s) leave it")
CATALOG["gaudi3"] = dataclasses.replace(
    CATALOG["gaudi2"], name="gaudi3", peak_bf16_flops=1835e12, peak_fp8_flops=1835e12, hbm_bytes=128 * GiB,
    hbm_bandwidth=3.7e12, intra_node_bandwidth=525e9, inter_node_bandwidth=75e9, power_watts=900,
    note="8x Gaudi 3: 21 on-chip 200 GbE RoCE ports join the node all-to-all, 3 (600 Gb/s) leave it")
CATALOG["tpu-v7"] = dataclasses.replace(
    CATALOG["tpu-v5p"], name="tpu-v7", peak_bf16_flops=2307e12, peak_fp8_flops=4614e12,
    hbm_bytes=192 * GiB, reserved_bytes=TPU_RUNTIME_BYTES, hbm_bandwidth=7.37e12, gpus_per_node=9216,
    intra_node_bandwidth=360e9, power_watts=0.0, usd_per_gpu_hour=0.0,
    note="TPU v7 (Ironwood): a pod is one 3D ICI torus of 9,216 chips, 1.2 TB/s of ICI per chip both ways")
CATALOG["v100-16gb"] = dataclasses.replace(
    CATALOG["v100"], name="v100-16gb", hbm_bytes=16 * GiB, note="DGX-1 V100 SXM2 16GB")
