"""The denominator of MFU: the datasheet peak FLOP/s of the hardware a job runs on.

GPUs: the hardware catalog's dense BF16 peak (fp32 runs use the same number, as MFU reports do).
CPUs: a datasheet-style number computed the way vendors do, physical cores x FLOP per cycle per
core x clock, with FLOP per cycle read off the SIMD flags in /proc/cpuinfo (CPU_FLOPS_PER_CYCLE).
A measured matmul is not a peak: it moves with the load on the machine (29 to 127 GFLOP/s on the
same 2 cores) and a depressed measurement turned into MFU above 100%. `shoal doctor --peak`
measures anyway and prints the two side by side.

The job's hardware: the cores this process may run on (os.sched_getaffinity), but no more than
its ranks can keep busy (local ranks x torch threads each), on every node. Four ranks on two
cores share those two cores' peak; they do not get four cores' worth.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

# FLOP per cycle per core, fp32, for the widest vector unit a flag promises, counting two vector
# FMA pipes per core and an FMA as 2 FLOP (Intel Xeon Scalable Gold/Platinum, AMD Zen 2-5, Arm
# Neoverse V1: the parts MFU is usually quoted on). Parts with one FMA pipe (Xeon Silver/Bronze,
# Zen 4's 512-bit ops on 256-bit pipes) peak at half of this: their MFU reads low, never high.
#   avx512f: 2 pipes x 16 fp32 lanes x 2 = 64
#   avx2 + fma: 2 x 8 x 2 = 32
#   avx without fma: one 8-lane add and one 8-lane multiply per cycle = 16
#   sse2: one 4-lane add and one 4-lane multiply = 8
#   Arm sve: assume 2 pipes x 16 lanes (512-bit, A64FX) x 2 = 64; asimd (NEON): 4 pipes x 4 lanes x 2 = 32
# BF16 (only when the training precision is bf16):
#   amx_bf16: an AMX tile unit does 1024 bf16 FLOP per cycle per core (Intel, Sapphire Rapids)
#   avx512_bf16: VDPBF16PS does 32 bf16 multiply-adds per 512-bit op, 2 pipes: 128
#   otherwise bf16 is converted and computed as fp32
CPU_FLOPS_PER_CYCLE = (  # (flag, fp32 FLOP/cycle, name), widest first
    ("avx512f", 64, "AVX-512"), ("fma", 32, "AVX2+FMA"), ("avx", 16, "AVX"), ("sse2", 8, "SSE2"),
    ("sve", 64, "SVE"), ("asimd", 32, "NEON"),
)
CPU_BF16_FLOPS_PER_CYCLE = (("amx_bf16", 1024, "AMX-BF16"), ("avx512_bf16", 128, "AVX512-BF16"))
UNKNOWN_CPU = (32, "unknown SIMD, assumed AVX2+FMA")
# The clock: the turbo ceiling, since one busy core runs at it. The kernel says it in cpufreq's
# cpuinfo_max_freq. Without that file (every VM, including the machine this was written on),
# "cpu MHz" and the model name's "@ 2.60GHz" are the nominal clock: a 2.6 GHz-nominal EPYC did
# 509 GFLOP/s of bf16 matmul on one core, which at 128 FLOP/cycle needs 4 GHz. So then assume the
# highest boost of current server CPUs (EPYC 9575F: 5.0 GHz): MFU errs low, never above 100%.
TURBO_CEILING_HZ = 5.0e9


@dataclass(frozen=True)
class Peak:
    flops: float  # FLOP/s of the whole job's hardware
    label: str  # what the number is, for the summary: "2-core AVX-512 datasheet peak 332 GFLOP/s"
    how: str = ""  # how it was reached: "2 cores x 64 FLOP/cycle x 2.60 GHz"


@dataclass(frozen=True)
class CpuInfo:
    flags: frozenset
    clock_hz: float  # the highest clock the cores may run at
    clock_source: str  # where clock_hz comes from
    core_of: dict  # logical cpu -> (package, core): SMT siblings share one core's vector units


def read_cpuinfo(text: str | None = None, sys_cpu: Path = Path("/sys/devices/system/cpu")) -> CpuInfo:
    if text is None:
        try:
            text = Path("/proc/cpuinfo").read_text()
        except OSError:
            text = ""
    flags: set[str] = set()
    core_of, nominal = {}, []
    for block in text.strip().split("\n\n"):
        fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in block.splitlines())}
        flags.update((fields.get("flags") or fields.get("Features") or "").split())
        if "processor" in fields and fields["processor"].isdigit():
            cpu = int(fields["processor"])
            core_of[cpu] = (fields.get("physical id", "0"), fields.get("core id", str(cpu)))
        if fields.get("cpu MHz"):
            nominal.append(float(fields["cpu MHz"]) * 1e6)
        m = re.search(r"@\s*([\d.]+)\s*GHz", fields.get("model name", ""))
        if m:
            nominal.append(float(m.group(1)) * 1e9)
    turbo = []
    for path in sys_cpu.glob("cpu[0-9]*/cpufreq/cpuinfo_max_freq"):
        try:
            turbo.append(float(path.read_text()) * 1e3)  # kHz
        except (OSError, ValueError):
            pass
    if turbo:
        clock, source = max(turbo), "cpuinfo_max_freq"
    else:
        said = f"{max(nominal) / 1e9:.2f} GHz nominal" if nominal else "no clock"
        clock, source = max(nominal + [TURBO_CEILING_HZ]), f"turbo ceiling assumed; /proc/cpuinfo says {said}"
    return CpuInfo(frozenset(flags), clock, source, core_of)


def usable_cores(info: CpuInfo, cpus: set[int] | None = None) -> int:
    """Physical cores among the logical CPUs this process may run on."""
    if cpus is None:
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    known = {info.core_of[c] for c in cpus if c in info.core_of}
    return max(1, len(known) + len([c for c in cpus if c not in info.core_of]))


def flops_per_cycle(flags: frozenset, precision: str) -> tuple[int, str]:
    """(FLOP per cycle per core, SIMD name) for the widest unit the flags promise (table above)."""
    if precision != "fp32":  # bf16 and bf16-params compute in bf16
        for flag, flop, name in CPU_BF16_FLOPS_PER_CYCLE:
            if flag in flags:
                return flop, name
    for flag, flop, name in CPU_FLOPS_PER_CYCLE:
        if flag in flags and (flag != "fma" or "avx2" in flags):
            return flop, name
    return UNKNOWN_CPU


def cpu_peak(precision: str, cores: int, info: CpuInfo | None = None) -> Peak:
    """Datasheet peak of `cores` physical cores of this CPU."""
    info = info or read_cpuinfo()
    flop, simd = flops_per_cycle(info.flags, precision)
    flops = cores * flop * info.clock_hz
    how = f"{cores} cores x {flop} FLOP/cycle x {info.clock_hz / 1e9:.2f} GHz ({info.clock_source})"
    return Peak(flops, f"{cores}-core {simd} datasheet peak {flops / 1e9:,.0f} GFLOP/s", how)


def job_peak(device, precision: str, world_size: int, local_world_size: int | None = None,
             threads: int | None = None) -> Peak:
    """Peak FLOP/s of all the hardware the job runs on: what job MFU divides by."""
    import torch

    local = local_world_size or int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    nodes = max(1, world_size // local)
    if device.type == "cuda":
        from shoal.hardware.lookup import lookup_gpu

        name = torch.cuda.get_device_name(device)
        entry = lookup_gpu(name)
        if entry is not None:
            per = entry.peak_bf16_flops
            return Peak(per * world_size, f"{world_size} x {name} datasheet bf16 peak {per / 1e12:,.0f} TFLOP/s")
        from shoal.hardware.matmul import matmul_flops

        per = matmul_flops(8192, torch.bfloat16, device).best  # a GPU the catalog does not know
        return Peak(per * world_size, f"{world_size} x {name} measured bf16 matmul {per / 1e12:,.0f} TFLOP/s")
    info = read_cpuinfo()
    busy = local * (threads or torch.get_num_threads())  # ranks x compute threads they run
    peak = cpu_peak(precision, min(usable_cores(info), busy), info)
    if nodes == 1:
        return peak
    return Peak(peak.flops * nodes, f"{nodes} nodes x {peak.label}", f"{nodes} nodes x {peak.how}")


def compare(precision: str = "fp32", seconds: float = 1.0) -> list[tuple[str, float, str]]:
    """`shoal doctor --peak`: (what, FLOP/s, how) for the datasheet peak and a measured matmul, this process's cores."""
    import torch

    from shoal.hardware.matmul import matmul_flops

    if torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
        peak = job_peak(device, precision, 1, 1)
        rate = matmul_flops(8192, torch.bfloat16, device, seconds=seconds)
        return [("datasheet", peak.flops, peak.label), ("measured", rate.best, f"best 8192^3 bf16 matmul of {rate.reps}")]
    info = read_cpuinfo()
    cores = usable_cores(info)
    peak = cpu_peak(precision, cores, info)
    threads = torch.get_num_threads()
    torch.set_num_threads(cores)
    try:
        dtype = torch.float32 if precision == "fp32" else torch.bfloat16
        rate = matmul_flops(1024, dtype, seconds=seconds)
    finally:
        torch.set_num_threads(threads)
    how = f"best 1024^3 {precision} matmul of {rate.reps} on {cores} threads (mean {rate.mean / 1e9:,.0f} GFLOP/s)"
    return [("datasheet", peak.flops, f"{peak.label}: {peak.how}"), ("measured", rate.best, how)]
