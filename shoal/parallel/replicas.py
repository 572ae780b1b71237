"""Replica groups that drop out and rejoin while the others keep training (torchft): where a
process sits among the groups, and each group's share of the batch. The quorum a training step
joins is shoal/train/replicas.py.

Data parallelism across replica groups: each group is its own torchrun job (its own process group,
any inner layout: dp_shard, tp, ...) and trains 1/groups of every global batch. Once a step, the
groups average their gradients through torchft's Manager instead of a fixed process group
(shoal/train/replicas.py):

- `start_step`: a quorum among the groups alive now, held by the lighthouse (Manager.start_quorum).
  A group that is behind (a restarted one) fetches the live state from a peer here, over HTTP, not
  from disk: model, optimizer, RNG, compressor state, data position and the step.
- `average_grads`: one all-reduce of all local gradients across the quorum, divided by the number
  of groups in it (torchft's reconfigurable gloo/NCCL group; inner shards meet the same shard of
  each other group, so any inner layout averages correctly).
- `should_commit`: every group agrees the step went through before its optimizer steps; if a peer
  died mid-step, nobody steps and the step is done again with the groups still alive.

A group whose worker dies leaves the quorum at the next step; its torchrun restarts the worker,
which joins a later quorum and heals. `shoal.launch.replica_groups` starts the lighthouse and the
groups on one machine; on many machines set the three variables below for each group's torchrun.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from datetime import timedelta

from shoal.errors import UserError

GROUP_ENV, GROUPS_ENV = "SHOAL_REPLICA_GROUP", "SHOAL_REPLICA_GROUPS"
LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"  # torchft's own name for the lighthouse address

COLLECTIVE_TIMEOUT = timedelta(seconds=10)
"""How long a group waits in the cross-group all-reduce for a peer that may have died. A dead
peer's socket usually closes at once; this bounds the hung-machine case."""
MANAGER_TIMEOUT = timedelta(seconds=60)
"""should_commit and the live-state transfer (a whole model over HTTP)."""
START_TIMEOUT_S = 300.0
"""A fresh job's first step waits this long for every group to be up (they start at different
speeds); then it goes on with the groups it has, and latecomers join as if restarted."""


@dataclass(frozen=True)
class ReplicaPlace:
    """Which replica group this process belongs to, of how many."""

    group: int = 0
    groups: int = 1


def replica_place() -> ReplicaPlace | None:
    """This worker's group, from the variables the replica launcher (or the user) sets; None when
    the job has no replica groups."""
    if GROUP_ENV not in os.environ:
        return None
    values = {}
    for name in (GROUP_ENV, GROUPS_ENV):
        raw = os.environ.get(name, "")
        try:
            values[name] = int(raw)
        except ValueError:
            raise UserError(name, raw, "environment variable must be an integer: the group's index and how "
                                       "many groups there are (shoal train --replica-groups N sets both)") from None
    group, groups = values[GROUP_ENV], values[GROUPS_ENV]
    if not 0 <= group < groups:
        raise UserError(GROUP_ENV, group, f"must be in 0..{groups - 1} ({GROUPS_ENV}={groups})")
    if not os.environ.get(LIGHTHOUSE_ENV):
        raise UserError(LIGHTHOUSE_ENV, None, f"environment variable must give the lighthouse's address when "
                                              f"{GROUP_ENV} is set, e.g. http://host:29510 (start one with "
                                              "torchft_lighthouse --min_replicas 1)")
    return ReplicaPlace(group, groups)


def import_torchft():
    """torchft, with its Rust side (lighthouse, manager server) logging warnings only, not every quorum."""
    os.environ.setdefault("RUST_LOG", "warn")  # read once, when the extension loads
    import torchft

    return torchft


def group_share(cfg, groups: int, source: str = "--replica-groups"):
    """The config one group trains with: its 1/groups of every global batch (`source` names where
    the number of groups came from, for the message)."""
    batch = cfg.train.global_batch
    if groups <= 1:
        return cfg
    if batch % groups:
        raise UserError("train.global_batch", batch, f"must split evenly among the {groups} replica groups "
                                                     f"({source}={groups}); set train.global_batch="
                                                     f"{groups * -(-batch // groups)}")
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, global_batch=batch // groups))
