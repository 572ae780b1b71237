"""A training step's side of the replica groups (torchft): the quorum, the gradients averaged across
the groups alive, the commit, and the live state a rejoining group heals from (shoal/parallel/replicas.py
says where a process sits among the groups and how the batch is shared)."""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings

from shoal.checkpoint import state as ckpt_state
from shoal.parallel.replicas import (COLLECTIVE_TIMEOUT, MANAGER_TIMEOUT, START_TIMEOUT_S, ReplicaPlace, import_torchft,
                                     replica_place)


class OneGroup:
    """No replica groups: every hook is the plain path (the quorum is this job alone)."""

    rejoining = False

    def start_step(self, step: int) -> int:
        return step

    def average_grads(self, params) -> None:
        pass

    def should_commit(self) -> bool:
        return True

    def row(self) -> dict:
        return {}

    def close(self) -> None:
        pass


class ReplicaGroups(OneGroup):
    """This group's side of the quorum: a torchft Manager and the state it hands to a rejoining peer."""

    def __init__(self, place: ReplicaPlace, rt, pm, optimizer, loader, start: int):
        import torch

        torchft = import_torchft()

        logging.getLogger("torchft.manager").addFilter(_QuietManagerLog())
        # torchft's transport rebuilds the received tensors over a read-only bytes buffer; they are only
        # copied into the model and optimizer (load_live_state), never written through.
        warnings.filterwarnings("ignore", message="The given buffer is not writable")

        self.place, self.rt, self.loader = place, rt, loader

        def live_state() -> dict:  # references; torchft's transport copies them out under its lock
            return {"train": ckpt_state.capture(pm.modules, optimizer, rt.rank, pm.grad_compressor,
                                                 pm.diloco),
                    "data": loader.state_dict()}

        def load_live_state(state: dict) -> None:
            ckpt_state.apply(pm.modules, optimizer, state["train"], pm.grad_compressor, pm.diloco)
            loader.load_state_dict(state["data"])

        store = {}
        if rt.world_size == 1:  # torchrun hosts no store for one worker without a process group; the
            self._store = torch.distributed.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
            store = dict(store_addr="localhost", store_port=self._store.port)  # Manager needs one
        pg = (torchft.ProcessGroupNCCL if rt.device.type == "cuda" else torchft.ProcessGroupGloo)(
            timeout=COLLECTIVE_TIMEOUT)
        # A restarted group finds its peers past step 0 and heals; one that is not behind is not sent
        # anything. Every group initializes the same weights from the seed, so step 0 needs no sync.
        self.manager = torchft.Manager(
            pg=pg, load_state_dict=load_live_state, state_dict=live_state, min_replica_size=1,
            use_async_quorum=False,  # heal before the forward pass: the step then runs on the live state
            timeout=MANAGER_TIMEOUT, quorum_timeout=MANAGER_TIMEOUT, rank=rt.rank, world_size=rt.world_size,
            replica_id=f"shoal_{place.group}", init_sync=False, **store)
        self.manager.load_state_dict({"step": start, "batches_committed": start * place.groups})
        self.rejoining = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
        self._wait_for_all = start == 0 and not self.rejoining
        self._data_at_start: dict = {}
        self._seconds = {"quorum_s": 0.0, "replica_allreduce_s": 0.0, "commit_s": 0.0}  # what torchft costs a step

    def start_step(self, step: int) -> int:
        """Join this step's quorum; returns the step to run, the live one after healing."""
        t0 = time.perf_counter()
        self.manager.start_quorum()
        if self._wait_for_all:  # a fresh job: the first step waits until every group is in the quorum
            self._wait_for_all = False
            deadline = time.monotonic() + START_TIMEOUT_S
            while self.manager.num_participants() < self.place.groups and time.monotonic() < deadline:
                time.sleep(0.2)
                self.manager.start_quorum()
        live = self.manager.current_step()
        if live != step and self.rt.is_main:
            print(f"shoal: replica group {self.place.group} rejoined at step {live} with the state of a live group "
                  f"(it was at step {step})", file=sys.stderr, flush=True)
        self._data_at_start = self.loader.state_dict()
        self._seconds["quorum_s"] = time.perf_counter() - t0
        return live

    def average_grads(self, params) -> None:
        """Mean of every gradient over the groups in the quorum, as one flat fp32 buffer."""
        import torch

        grads = [_local(p.grad) for p in params if p.grad is not None]
        if not grads:
            return
        t0 = time.perf_counter()
        flat = torch.cat([g.reshape(-1).float() for g in grads])
        self.manager.allreduce(flat).wait()  # divides by the participants; a failure shows in should_commit
        for g, part in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(part.view_as(g))
        self._seconds["replica_allreduce_s"] = time.perf_counter() - t0

    def should_commit(self) -> bool:
        t0 = time.perf_counter()
        committed = self.manager.should_commit()
        self._seconds["commit_s"] = time.perf_counter() - t0
        if not committed:  # the step is redone: take the same batch again
            self.loader.load_state_dict(self._data_at_start)
        return committed

    def row(self) -> dict:
        return {"replicas": self.manager.num_participants(), "replica_group": self.place.group, **self._seconds}

    def close(self) -> None:
        self.manager.shutdown(wait=False)


class _QuietManagerLog(logging.Filter):
    """torchft warns on every quorum that it cannot reset NCCL's flight recorder, also where there is
    no NCCL; and a peer's death, expected here, comes with a traceback: keep its one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info, record.exc_text = None, None
        return "flight recorder" not in str(record.msg)


def _local(grad):
    """A DTensor gradient's local shard (the same shard of every group meets in the all-reduce)."""
    from torch.distributed.tensor import DTensor

    return grad.to_local() if isinstance(grad, DTensor) else grad


def join_replicas(rt, pm, optimizer, loader, start: int) -> OneGroup:
    """This group's member of the quorum, made last so that a restarted group asks to join only when
    it is ready to step (a peer waits for a heartbeating group that has not asked yet)."""
    place = replica_place()
    if place is None:
        return OneGroup()
    return ReplicaGroups(place, rt, pm, optimizer, loader, start)
