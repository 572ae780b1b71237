"""The end of a multi-node job: node 0 keeps the rendezvous store up until every other node has left it.

The store the agents meet in lives in node 0's launcher process (under c10d and static rendezvous alike).
torch's agents end a successful job with an exit barrier on that store, then close the
rendezvous through it. Nothing keeps node 0 from finishing both first and exiting, taking the store with it,
while another node still waits in the barrier or closes: that node then prints a C++ stack ("Failed to recv
... Did the remote server shutdown or crash?"), "Error waiting on exit barrier" with a Python traceback and
"failed to shutdown the rendezvous", after a job that succeeded (pytorch#69520, open since 2021). It takes a
node that is last at the barrier and slower to leave than node 0: seen in a full test run on 2 busy cores,
and every time over a thin link (tests/cluster/test_two_nodes.py).

So for the length of the launch every node, once it has closed the rendezvous, adds itself to a count in
the store, and node 0 does not return from its own close until the count says every other node has: a
few store round trips after the last node passes the barrier. This happens only after a node's exit
barrier, i.e. when its own workers succeeded, and node 0 waits LEAVE_WAIT_S at most: a job that failed, or a
node that died after its workers finished, ends as it did before.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

LEFT_KEY = "shoal/nodes_left"
LEAVE_WAIT_S = 30.0
"""How long node 0 waits for the others at the end, at most: torch's own rendezvous close deadline
(RendezvousTimeout's close, 30 s); the others are a few store round trips from done when it starts."""


@contextlib.contextmanager
def store_kept_until_every_node_left(nnodes: int, is_host: bool) -> Iterator[None]:
    """While the launch runs in this process, torch's agent and rendezvous handlers leave (or, on node 0,
    wait for the others to leave) as the module docstring says."""
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler
    from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous

    barrier = SimpleElasticAgent._exit_barrier
    handlers = (DynamicRendezvousHandler, StaticTCPRendezvous)
    shutdowns = [h.shutdown for h in handlers]
    succeeded = []

    def exit_barrier(agent) -> None:  # torch calls it only once this node's workers all succeeded
        succeeded.append(True)
        barrier(agent)

    def shutdown_and_leave(original):
        def shutdown(handler) -> bool:
            closed = original(handler)
            store = getattr(handler, "_store", None)  # the handler's TCPStore: node 0 hosts it
            if store is not None and succeeded:
                try:
                    if not is_host:
                        store.add(LEFT_KEY, 1)
                    else:
                        deadline = time.monotonic() + LEAVE_WAIT_S
                        while store.add(LEFT_KEY, 0) < nnodes - 1 and time.monotonic() < deadline:
                            time.sleep(0.05)
                except Exception:  # noqa: BLE001  (node 0 and its store are gone already: nothing left to keep up)
                    pass
            return closed
        return shutdown

    SimpleElasticAgent._exit_barrier = exit_barrier
    for handler, original in zip(handlers, shutdowns):
        handler.shutdown = shutdown_and_leave(original)
    try:
        yield
    finally:
        SimpleElasticAgent._exit_barrier = barrier
        for handler, original in zip(handlers, shutdowns):
            handler.shutdown = original
