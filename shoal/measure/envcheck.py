"""`shoal doctor`'s environment checks: each returns a verdict (ok / warn / fail / info) and why.

They run in the doctor's own process before any worker starts, so a broken environment gets a
clear line instead of a hung rendezvous.
"""

from __future__ import annotations

import os
import platform
import resource
import shutil
import socket
from dataclasses import dataclass
from datetime import timedelta


@dataclass
class Check:
    name: str
    verdict: str  # "ok" | "warn" | "fail" | "info"
    detail: str


def versions() -> Check:
    import torch

    return Check("versions", "ok", f"python {platform.python_version()}, torch {torch.__version__}")


def backends() -> Check:
    import torch.distributed as dist

    if not dist.is_available():
        return Check("backends", "fail", "torch.distributed is not available in this torch build")
    have = [b for b, ok in (("gloo", dist.is_gloo_available()), ("nccl", dist.is_nccl_available()),
                            ("mpi", dist.is_mpi_available())) if ok]
    if "gloo" not in have:
        return Check("backends", "fail", f"gloo missing (have: {', '.join(have) or 'none'}); CPU jobs and shoal's checker need it")
    return Check("backends", "ok", ", ".join(have))


def cuda_devices(nproc: int) -> Check:
    import torch

    if not torch.cuda.is_available():
        return Check("devices", "info", f"no CUDA device: the benchmark runs gloo on CPU ({os.cpu_count()} cores)")
    n = torch.cuda.device_count()
    names = sorted({torch.cuda.get_device_name(i) for i in range(n)})
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else "?"
    detail = f"{n} x {', '.join(names)}; CUDA {torch.version.cuda}, NCCL {nccl}"
    if nproc > n:
        return Check("devices", "fail", f"{detail}; --nproc {nproc} needs one GPU per rank")
    return Check("devices", "ok", detail)


def cpu_oversubscription(nproc: int) -> Check:
    import torch

    if torch.cuda.is_available():
        return Check("cpu", "ok", f"{os.cpu_count()} cores")
    cores = os.cpu_count() or 1
    from shoal.worker.env import omp_threads

    threads = omp_threads()
    if nproc * threads > cores:
        return Check("cpu", "warn", f"{nproc} ranks x {threads} threads on {cores} cores: timings will be "
                                    "slower and noisier than the hardware allows")
    return Check("cpu", "ok", f"{nproc} ranks x {threads} threads on {cores} cores")


def shared_memory(min_gib: float = 1.0) -> Check:
    """NCCL's intra-node transport and DataLoader workers live in /dev/shm; containers often cap it at 64 MB."""
    if not os.path.isdir("/dev/shm"):
        return Check("shared memory", "info", "no /dev/shm on this system")
    free = shutil.disk_usage("/dev/shm").free / 2**30
    verdict = "ok" if free >= min_gib else "warn"
    fix = "" if verdict == "ok" else f" (below {min_gib:g} GiB: NCCL may fail; e.g. docker run --shm-size=16g)"
    return Check("shared memory", verdict, f"/dev/shm {free:.1f} GiB free{fix}")


def file_limit(world_hint: int) -> Check:
    """Each rank holds sockets to its peers (gloo: a full mesh) plus files; low limits fail at scale."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = max(1024, 4 * world_hint)
    if soft < need:
        return Check("open files", "warn" if soft >= 256 else "fail",
                     f"ulimit -n is {soft} (hard {hard}); raise it to at least {need} (ulimit -n {min(hard, 65536)})")
    return Check("open files", "ok", f"ulimit -n {soft} (hard {hard})")


def free_port() -> Check:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    except OSError as e:
        return Check("free ports", "fail", f"cannot bind a local TCP port: {e}")
    from shoal.worker.env import master_port

    wanted = master_port()
    if wanted:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            if s.connect_ex(("127.0.0.1", wanted)) == 0:
                return Check("free ports", "info", f"MASTER_PORT {wanted} is in use here (fine if the rendezvous server runs here)")
    return Check("free ports", "ok", f"can bind local ports (got {port})")


def hostname() -> Check:
    host = socket.gethostname()
    try:
        addr = socket.gethostbyname(host)
    except OSError as e:
        return Check("hostname", "warn", f"{host} does not resolve ({e}); set GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME")
    return Check("hostname", "ok", f"{host} -> {addr}")


def rendezvous(timeout_s: float = 3.0) -> Check:
    """MASTER_ADDR:MASTER_PORT reachable when set; otherwise a local c10d store round trip."""
    from torch.distributed import TCPStore

    from shoal.worker.env import master_port

    addr, port = os.environ.get("MASTER_ADDR"), master_port()
    if addr and port:
        try:
            with socket.create_connection((addr, port), timeout=timeout_s):
                return Check("rendezvous", "ok", f"{addr}:{port} accepts connections")
        except OSError as e:
            return Check("rendezvous", "fail", f"{addr}:{port} unreachable: {e}")
    try:
        server = TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=timeout_s), wait_for_workers=False)
        client = TCPStore("127.0.0.1", server.port, 1, False, timedelta(seconds=timeout_s))
        client.set("doctor", "ok")
        assert server.get("doctor") == b"ok"
    except Exception as e:  # any failure here is the answer
        return Check("rendezvous", "fail", f"local c10d store round trip failed: {e}")
    return Check("rendezvous", "ok", "local c10d TCPStore round trip works (MASTER_ADDR not set)")


def run_all(nproc: int) -> list[Check]:
    return [versions(), backends(), cuda_devices(nproc), cpu_oversubscription(nproc), shared_memory(),
            file_limit(nproc), free_port(), hostname(), rendezvous()]
