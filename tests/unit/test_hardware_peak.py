"""The CPU peak MFU divides by: a datasheet number from the flags, cores and clock, never below what a matmul does."""

from __future__ import annotations

import pytest
import torch

from shoal.hardware import peak

# two sockets x two cores x two hyperthreads, as /proc/cpuinfo lists them
CPUINFO = "\n\n".join(
    f"processor\t: {cpu}\nmodel name\t: Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz\nphysical id\t: {cpu // 4}\n"
    f"core id\t\t: {cpu % 4 // 2}\ncpu MHz\t\t: 1000.000\nflags\t\t: fpu sse2 avx fma avx2 avx512f avx512_bf16"
    for cpu in range(8))


def test_flags_cores_and_clock_make_the_datasheet_peak(tmp_path):
    (tmp_path / "cpu0" / "cpufreq").mkdir(parents=True)
    (tmp_path / "cpu0" / "cpufreq" / "cpuinfo_max_freq").write_text("3700000\n")  # kHz
    info = peak.read_cpuinfo(CPUINFO, sys_cpu=tmp_path)
    assert info.clock_hz == 3.7e9 and info.clock_source == "cpuinfo_max_freq"
    assert peak.usable_cores(info, set(range(8))) == 4  # hyperthreads share a core's FMA units
    assert peak.usable_cores(info, {0, 1, 2}) == 2
    p = peak.cpu_peak("fp32", 4, info)
    assert p.flops == 4 * 64 * 3.7e9 and p.label == "4-core AVX-512 datasheet peak 947 GFLOP/s"
    assert peak.cpu_peak("bf16", 4, info).flops == 4 * 128 * 3.7e9
    # without cpufreq (a VM) the clocks in /proc/cpuinfo are nominal: the turbo ceiling stands in
    vm = peak.read_cpuinfo(CPUINFO, sys_cpu=tmp_path / "none")
    assert vm.clock_hz == peak.TURBO_CEILING_HZ and "2.40 GHz nominal" in vm.clock_source
    assert peak.flops_per_cycle(frozenset({"sse2", "avx", "fma", "avx2"}), "fp32") == (32, "AVX2+FMA")
    assert peak.flops_per_cycle(frozenset({"sse2", "avx", "fma"}), "fp32") == (16, "AVX")  # FMA4-era: no avx2
    assert peak.flops_per_cycle(frozenset({"fp", "asimd"}), "bf16") == (32, "NEON")
    assert peak.flops_per_cycle(frozenset(), "fp32") == peak.UNKNOWN_CPU


def test_four_ranks_on_two_cores_share_two_cores(monkeypatch):
    info = peak.read_cpuinfo(CPUINFO.replace("avx512f", ""))
    monkeypatch.setattr(peak, "read_cpuinfo", lambda: info)
    monkeypatch.setattr(peak.os, "sched_getaffinity", lambda pid: {0, 2}, raising=False)  # two physical cores
    cpu = torch.device("cpu")
    two_cores = peak.cpu_peak("fp32", 2, info).flops
    assert peak.job_peak(cpu, "fp32", world_size=4, local_world_size=4, threads=1).flops == two_cores
    assert peak.job_peak(cpu, "fp32", world_size=1, local_world_size=1, threads=2).flops == two_cores
    assert peak.job_peak(cpu, "fp32", world_size=1, local_world_size=1, threads=1).flops == two_cores / 2
    two_nodes = peak.job_peak(cpu, "fp32", world_size=8, local_world_size=4, threads=1)
    assert two_nodes.flops == 2 * two_cores and two_nodes.label.startswith("2 nodes x 2-core AVX2+FMA")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_no_matmul_beats_the_datasheet_peak_of_this_machine(precision):
    """MFU <= 100% needs peak >= anything achievable: measure the best matmul on this process's cores."""
    datasheet, measured = peak.compare(precision, seconds=0.3)
    assert 0 < measured[1] <= datasheet[1], (measured, datasheet)
