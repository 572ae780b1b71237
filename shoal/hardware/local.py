"""The `local` hardware entry: this machine as the planner sees it, from a profile that
shoal.measure.local_profile measured (matmul and copy rates, gloo's bandwidth and latency, the cost
of one kernel), cached at $SHOAL_CACHE_DIR/local_profile.json; and how that entry changes with the
number of ranks sharing the machine's cores. The catalog of real accelerators is hardware.py.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

from shoal.cache import cache_dir, one_filler
from shoal.errors import UserError
from shoal.hardware.gpu import GPU, GiB


LOCAL_PROCESS_BYTES = 0.3 * GiB
"""A CPU rank's own footprint beyond the model: the interpreter, torch's libraries, gloo (the GPU
entries' reserved_bytes is a CUDA context, NCCL and cuBLAS workspaces instead)."""


LOCAL_ALLOCATOR_SLACK = 0.7
"""glibc malloc's slack on a CPU rank: what the process's resident set holds beyond the live tensors,
as a fraction of the memory that comes and goes each step."""


def local_profile_path() -> Path:
    return cache_dir() / "local_profile.json"


def local_gpu(*, remeasure: bool = False) -> GPU:
    """The `local` entry from the cached measurement, measuring first if there is none (or if asked).

    Measuring needs torch.distributed, which the planner never imports: it runs in a subprocess.
    """
    path = local_profile_path()
    if remeasure or not path.exists():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # $SHOAL_CACHE_DIR a file, under one, or not writable
            raise UserError("gpu", "local", f"the measurement's cache folder {path.parent} cannot be created "
                                            f"({e.strerror}); set $SHOAL_CACHE_DIR to a writable folder") from None
        with one_filler(path):  # a process that waited here finds the profile the first one measured
            if remeasure or not path.exists():
                _measure(path)
    try:
        return gpu_from_profile(json.loads(path.read_bytes()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:  # not JSON, a dict, or its numbers
        raise UserError("gpu", "local", f"the cached measurement {path} is damaged ({type(e).__name__}); measure "
                                        "this machine again with --remeasure") from None


def _measure(path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "shoal.measure.local_profile", "--out", str(path)],
                          capture_output=True, text=True)
    if proc.returncode != 0 or not path.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise UserError("gpu", "local", f"measuring this machine failed ({tail[0]}); "
                                        f"describe it with --hw-file instead")


def is_local(gpu: GPU) -> bool:
    """The measured `local` entry, or a hardware file built on it (`base = "local"`, named local+FILE)."""
    return gpu.name.split("+", 1)[0] == "local"


def local_for_ranks(gpu: GPU, ranks: int) -> GPU:
    """The `local` entry as `ranks` processes on one node see it; its gpus_per_node is the node's
    cores (one rank per core is how the profile was measured: launched workers get
    OMP_NUM_THREADS=1, shoal/launch/local.py).

    - One process keeps torch's default, every core: its matmul and copy rates scale with the
      cores (approximately: linear), it has the whole memory, and each small op pays OpenMP's fork
      and join on top of its dispatch (kernel_gap_one_process, measured so).
    - More ranks than cores time-share them: Linux's scheduler (CFS) gives each runnable process an
      equal share, so each rank's compute, memory and loopback-link rates are cores/ranks of one
      core's, and each op's dispatch and each collective step's latency take ranks/cores as long.
    """
    cores = gpu.gpus_per_node
    if not is_local(gpu) or cores < 1 or ranks == cores:
        return gpu
    if ranks == 1:
        return dataclasses.replace(gpu, peak_bf16_flops=gpu.peak_bf16_flops * cores,
                                   peak_fp32_flops=gpu.peak_fp32_flops * cores, hbm_bandwidth=gpu.hbm_bandwidth * cores,
                                   hbm_bytes=gpu.hbm_bytes * cores, gpus_per_node=1,
                                   kernel_gap=gpu.kernel_gap_one_process or gpu.kernel_gap)
    if ranks < cores:
        return gpu
    share = cores / ranks
    return dataclasses.replace(gpu, peak_bf16_flops=gpu.peak_bf16_flops * share,
                               peak_fp32_flops=gpu.peak_fp32_flops * share, hbm_bandwidth=gpu.hbm_bandwidth * share,
                               hbm_bytes=gpu.hbm_bytes * share, intra_node_bandwidth=gpu.intra_node_bandwidth * share,
                               intra_node_latency=gpu.intra_node_latency / share, kernel_gap=gpu.kernel_gap / share,
                               tp_kernel_overhead=gpu.tp_kernel_overhead / share,
                               tp_redistribute_latency=gpu.tp_redistribute_latency / share,
                               tp_redistribute_per_byte=gpu.tp_redistribute_per_byte / share,
                               gpus_per_node=ranks)


def gpu_from_profile(profile: dict) -> GPU:
    """A catalog entry from a measured profile; measured rates are achievable rates (efficiency 1)."""
    ranks = max(1, int(profile.get("cpu_count", 1)))
    return GPU(
        name="local",
        peak_bf16_flops=float(profile["matmul_bf16_flops"]),
        peak_fp32_flops=float(profile["matmul_fp32_flops"]),
        matmul_efficiency=1.0,
        # CPU SDPA's causal forward + backward against the matmul rate, measured (0.34 here); profiles
        # from before it was measured get 0.5
        attention_efficiency=float(profile.get("attention_efficiency", 0.5)),
        hbm_bytes=float(profile["memory_bytes"]) / ranks,  # ranks share the machine's memory
        hbm_bandwidth=float(profile["copy_bandwidth"]),
        hbm_efficiency=1.0,
        gpus_per_node=ranks,  # one rank per core
        intra_node_bandwidth=float(profile["gloo_busbw"]),
        intra_node_efficiency=1.0,
        intra_node_latency=float(profile["gloo_latency"]),
        inter_node_bandwidth=float(profile.get("inter_node_bandwidth", 1.25e9)),  # 10 GbE if ever multi-host
        inter_node_efficiency=0.9,
        inter_node_latency=float(profile.get("inter_node_latency", 50e-6)),
        # kernel_overhead: per counted kernel of a real layer; op_overhead, a bare multiply, is what
        # profiles measured before it (--remeasure replaces it)
        kernel_gap=float(profile.get("kernel_overhead", profile.get("op_overhead", 20e-6))),
        kernel_gap_one_process=float(profile.get("kernel_overhead_all_cores", 0.0)),
        host_op_cost=0.0, host_gemm_cost=0.0,  # derived from kernel_gap (planner/compute.host_op_cost)
        tp_kernel_overhead=float(profile.get("tp_kernel_overhead", 0.0)),
        tp_redistribute_latency=float(profile.get("tp_redistribute_latency", 0.0)),
        tp_redistribute_per_byte=float(profile.get("tp_redistribute_per_byte", 0.0)),
        allocator_slack=LOCAL_ALLOCATOR_SLACK,
        overlap_cost=1.0, ring_overlap_cost=1.0,
        reserved_bytes=LOCAL_PROCESS_BYTES,
        note=f"measured on {profile.get('host', 'this machine')} at {profile.get('measured_at', '?')} "
             f"(one thread per rank, gloo between local processes)",
    )
