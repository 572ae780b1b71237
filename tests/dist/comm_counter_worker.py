"""Runs under `shoal run --nproc 2`: trains a few layouts with shoal's CommCounter and, at the same
time, a TorchDispatchMode that sees every collective op at the dispatcher (the reference: complete,
but too slow to leave on). Each rank writes both counts per step to OUT/rank<R>.json."""

import json
import sys
from collections import Counter
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

import shoal.train.step as step
import shoal.train.trainer as trainer
from shoal.train.parity import config_for
from shoal.comm.counter import CommCounter, nbytes
from shoal.comm.ops import wire_bytes

OPS = {  # dispatcher op -> (kind, payload argument, input-splits argument for all_to_all)
    "c10d::allreduce_": ("all_reduce", 0, None), "c10d::allreduce_coalesced_": ("all_reduce", 0, None),
    "c10d::_allgather_base_": ("all_gather", 1, None), "c10d::allgather_": ("all_gather", 1, None),
    "c10d::allgather_into_tensor_coalesced_": ("all_gather", 1, None),
    "c10d::_reduce_scatter_base_": ("reduce_scatter", 1, None), "c10d::reduce_scatter_": ("reduce_scatter", 1, None),
    "c10d::reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1, None),
    "c10d::alltoall_base_": ("all_to_all", 1, 4), "c10d::broadcast_": ("broadcast", 0, None),
    "c10d::send": ("send", 0, None),
    "_c10d_functional::all_reduce": ("all_reduce", 0, None),
    "_c10d_functional::all_gather_into_tensor": ("all_gather", 0, None),
    "_c10d_functional::reduce_scatter_tensor": ("reduce_scatter", 0, None),
    "_c10d_functional::all_to_all_single": ("all_to_all", 0, 2),
}

NOT_SENDING = {"c10d::recv_", "c10d::barrier", "_c10d_functional::wait_tensor", "_c10d_functional::_wrap_tensor_autograd"}


def group_of(args):
    from torch.distributed.distributed_c10d import _resolve_process_group

    boxed = [a for a in args if isinstance(a, torch.ScriptObject)]  # c10d ops: the group, boxed
    pg = torch.distributed.ProcessGroup.unbox(boxed[0]) if boxed else _resolve_process_group(args[-1])
    return pg.size(), pg.rank()


class Reference(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.bytes = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(issubclass(t, DTensor) for t in types):
            # Let DTensor handle it with this mode still active, so the collectives DTensor issues
            # inside its own dispatch (redistributing operands, loss_parallel) are seen too.
            return NotImplemented
        spec = OPS.get(func._schema.name)
        if func._schema.name.startswith(("c10d::", "_c10d_functional")) and spec is None:
            assert func._schema.name in NOT_SENDING, f"a collective this test does not know: {func}"
        if spec is not None:
            kind, index, splits_at = spec
            n, rank = group_of(args)
            payload = nbytes(args[index])
            own = None
            if splits_at is not None:
                splits = args[splits_at]
                own = payload * splits[rank] // sum(splits) if splits and sum(splits) else payload // n
            self.bytes[kind] += int(wire_bytes(kind, payload, n, own))
        return func(*args, **(kwargs or {}))


STEPS = []


class Both:
    """Stands in for CommCounter in the trainer: runs the real one inside the reference."""

    def __init__(self, labels=None):
        self.real, self.ref = CommCounter(labels), Reference()
        self.bytes, self.by_dtype, self.by_dim = self.real.bytes, self.real.by_dtype, self.real.by_dim

    def reset(self):
        """A new step: the trainer may enter the counter more than once within it."""
        self.real.reset()
        self.ref.bytes.clear()
        STEPS.append(None)

    def __enter__(self):
        self.ref.__enter__()
        self.real.__enter__()
        return self

    def __exit__(self, *exc):
        self.real.__exit__(*exc)
        self.ref.__exit__(*exc)
        STEPS[-1] = {"shoal": dict(self.real.bytes), "reference": dict(self.ref.bytes), "by_dim": dict(self.real.by_dim)}


if __name__ == "__main__":
    out, layouts = Path(sys.argv[1]), sys.argv[2].split(";")
    step.CommCounter = Both  # TrainStep counts each step's bytes
    results = {}
    for i, layout in enumerate(layouts):
        STEPS.clear()
        trainer.train(config_for(layout, 2, steps=3), out / f"layout{i}", show=False, keep_process_group=True)
        results[layout] = list(STEPS)
    rank = torch.distributed.get_rank()
    (out / f"rank{rank}.json").write_text(json.dumps(results))
    torch.distributed.destroy_process_group()
