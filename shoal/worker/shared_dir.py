"""Is a directory one directory for every node of the job? (checkpoints need it to be)

A checkpoint is one directory that every rank writes its shard into. If each node has its own
copy of that path (a local disk, a tmpfs), every save "commits" with the shards scattered over the
nodes, and a resume on any one node finds a damaged checkpoint. Nothing fails before that, so
shoal looks first: with the process group up, the lowest rank of each node writes a probe file
holding a random token, every rank reads every node's probe back, the answers are gathered, and
the probes are removed. `shoal train` runs it before its first save (shoal/train/trainer.py) and
`shoal doctor --nnodes` before it measures; this module is the one place the rule lives.

A node is what the launcher calls one: torchrun's GROUP_RANK (the node's index in the
rendezvous), else the host name. Jobs whose ranks all sit on one node skip the probe.
"""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path

from shoal.errors import UserError
from shoal.files import PROBE_PREFIX


def node_name() -> tuple[str, str]:
    """(this process's node, its host name): the node is torchrun's GROUP_RANK where it is set."""
    host = socket.gethostname()
    return os.environ.get("GROUP_RANK", host), host


def unshared_nodes(directory: Path) -> list[str]:
    """Collective over the default process group: what stops `directory` from being one directory
    for all nodes, each as 'node K (host) cannot write there (why)' or 'node K (host) cannot see node
    J's (host) probe file there' ([] when shared, or when the job has one node). Every rank gets
    the same answer."""
    import torch.distributed as dist

    me = node_name()
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, me)
    if len(set(everyone)) == 1:
        return []
    writer = everyone.index(me) == dist.get_rank()  # the lowest rank of each node writes its probe
    probe = None
    if writer:
        token = secrets.token_hex(16)
        path = directory / f"{PROBE_PREFIX}{me[0]}-{token[:8]}"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            path.write_text(token)
            probe = (me, path.name, token)
        except OSError as e:  # said below like any other node's failure, not a hang in the next gather
            probe = (me, None, e.strerror)
    probes: list = [None] * dist.get_world_size()
    dist.all_gather_object(probes, probe)  # every probe is written before anyone reads
    unwritable = sorted({f"node {node[0]} ({node[1]}) cannot write there ({why})"
                         for node, name, why in filter(None, probes) if name is None})
    probes = [p for p in probes if p is not None and p[1] is not None]
    missing = [(node, name) for node, name, token in probes if not _holds(directory / name, token)]
    seen: list = [None] * dist.get_world_size()
    dist.all_gather_object(seen, (me, missing))  # every read is done before the probes go
    if writer and probe[1]:
        (directory / probe[1]).unlink(missing_ok=True)
    problems = {f"node {who[0]} ({who[1]}) cannot see node {node[0]}'s ({node[1]}) probe file there"
                for who, lost in seen for node, _ in lost}
    return unwritable + sorted(problems)


def _holds(path: Path, token: str) -> bool:
    try:
        return path.read_text() == token
    except OSError:
        return False


def unshared_message(problems: list[str], field: str, directory: Path) -> UserError:
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return UserError(field, str(directory), f"is not one directory for all nodes: {problems[0]}{more}; "
                     f"checkpoint shards would be split over the nodes' disks. Use a path on a filesystem every "
                     f"node mounts (NFS, Lustre, ...)")
