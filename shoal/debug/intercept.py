"""Where collectives are caught, and how to put everything back (`Patches.undo`).

Three layers, all patched in place so code that already imported torch.distributed sees them:

* `ProcessGroup` methods (allreduce, all_gather_single, send, ...). Every Python-level c10d API —
  dist.all_reduce, all_gather_into_tensor, reduce_scatter_tensor, all_to_all(_single), broadcast,
  barrier, send/recv/isend/irecv, batch_isend_irecv and P2POp, the *_object collectives — ends in
  one of these calls, as do FSDP2 (dist.all_gather_single / reduce_scatter_single) and
  torch.distributed.pipelining (P2POp batches). Patching the methods rather than the API functions
  also leaves `P2POp.op is dist.isend` identity checks intact.
* `Work.wait`, where async work blocks: the watchdog sees what a rank waits on, and the checker
  verifies point-to-point fingerprints there.
* Functional collectives (`torch.distributed._functional_collectives`), which DTensor and tensor
  parallelism use and which go straight to C++ ops, bypassing ProcessGroup methods; plus
  DTensor's `shard_dim_alltoall`, patched when DTensor is imported.

Not covered (they never come back to Python): collectives issued from C++ — DDP's built-in bucket
all-reduce (see `watch_ddp`), the backward collectives of functional collectives, and anything
inside a torch.compile'd graph.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import inspect
import sys
import threading

import torch
import torch.distributed as dist

from shoal.debug import fingerprint
from shoal.debug.monitor import P2P, Monitor

PG_OPS = (
    "allreduce", "allreduce_coalesced", "allgather", "allgather_coalesced", "all_gather_single",
    "_allgather_base", "allgather_into_tensor_coalesced", "all_gather_single_coalesced", "reduce_scatter",
    "reduce_scatter_single", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced",
    "reduce_scatter_single_coalesced", "alltoall", "alltoall_base", "all_to_all_single", "broadcast", "reduce",
    "gather", "scatter", "barrier", "monitored_barrier", "send", "recv", "recv_anysource",
)
# functional collective -> the op it performs (callers reach the same op through different names)
FUNCOL_OPS = {
    "broadcast": "broadcast", "all_reduce": "all_reduce", "all_reduce_inplace": "all_reduce",
    "all_gather_single": "all_gather_single", "all_gather_single_autograd": "all_gather_single",
    "all_gather_tensor": "all_gather_single", "all_gather_tensor_autograd": "all_gather_single",
    "all_gather_inplace": "all_gather_single", "reduce_scatter_single": "reduce_scatter_single",
    "reduce_scatter_single_autograd": "reduce_scatter_single", "reduce_scatter_tensor": "reduce_scatter_single",
    "reduce_scatter_tensor_autograd": "reduce_scatter_single", "all_reduce_coalesced": "all_reduce_coalesced",
    "all_gather_single_coalesced": "all_gather_single_coalesced",
    "all_gather_into_tensor_coalesced": "all_gather_single_coalesced",
    "reduce_scatter_single_coalesced": "reduce_scatter_single_coalesced",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_single_coalesced",
    "all_to_all_single": "all_to_all_single", "all_to_all_single_autograd": "all_to_all_single",
    "all_to_all_inplace": "all_to_all_single", "permute_tensor": "permute_tensor",
}
DTENSOR_MODULES = ("torch.distributed.tensor._collective_utils", "torch.distributed.tensor.placement_types")

_MISSING = object()
_tls = threading.local()  # functional collectives call each other; only the outermost is recorded


class Patches:
    """Attribute replacements that can all be undone."""

    def __init__(self):
        self._undo: list[tuple[object, str, object]] = []
        self.hooks: list[_AfterImport] = []

    def replace(self, obj, name: str, value) -> None:
        # Keep the raw class attribute: for a pybind11 class, getattr() returns the unbound
        # function, and putting that back would lose the method binding.
        own = vars(obj)
        self._undo.append((obj, name, own[name] if name in own else _MISSING))
        setattr(obj, name, value)

    def undo(self) -> None:
        for hook in self.hooks:  # import hooks that never fired
            if hook in sys.meta_path:
                sys.meta_path.remove(hook)
        while self._undo:
            obj, name, original = self._undo.pop()
            if original is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, original)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Run `fn(module)` right after `name` is imported (for modules that bind functions by name)."""

    def __init__(self, name: str, fn):
        self.name, self.fn = name, fn

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # one shot: let the real finders find it
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            loader, fn = spec.loader, self.fn
            real_exec = loader.exec_module

            def exec_module(module):
                real_exec(module)
                fn(module)

            loader.exec_module = exec_module
        return spec


# -- wrappers ------------------------------------------------------------------------------------
def _pg_method(mon: Monitor, op: str, original):
    if op in P2P:
        def p2p(self, *args, **kwargs):
            rec, pending = mon.begin_p2p(self, op, args)
            try:
                work = original(self, *args, **kwargs)
            except Exception as e:
                mon.failed(rec, e)
                raise
            mon.issued(self, rec, work, pending)
            return work
        return p2p

    def collective(self, *args, **kwargs):
        rec = mon.begin(mon.group(self), op, None, lambda: fingerprint.from_pg_call(op, args))
        try:
            work = original(self, *args, **kwargs)
        except Exception as e:
            mon.failed(rec, e)
            raise
        mon.issued(self, rec, work, None)
        return work
    return collective


def _coalescing(mon: Monitor, start: bool, original):
    def wrapper(self, *args, **kwargs):
        if start:
            mon.coalescing(self, True)
            return original(self, *args, **kwargs)
        work = original(self, *args, **kwargs)
        mon.coalescing(self, False, work)
        return work
    return wrapper


def _wait(mon: Monitor, original):
    def wait(self, *args, **kwargs):
        tracked = mon.before_wait(self)
        if tracked is None:
            return original(self, *args, **kwargs)
        recs, pendings = tracked
        try:
            result = original(self, *args, **kwargs)
        except Exception as e:
            mon.failed(recs[-1], e)
            raise
        mon.after_wait(recs, self, pendings)
        return result
    return wait


def _arg(args, kwargs, index: int | None, name: str, default=None):
    if name in kwargs:
        return kwargs[name]
    if index is not None and index < len(args):
        return args[index]
    return default


def _funcol(mon: Monitor, funcol, name: str, original):
    op = FUNCOL_OPS[name]
    params = list(inspect.signature(original).parameters)
    idx = {p: i for i, p in enumerate(params)}
    tensor_name = next((p for p in ("self", "inputs", "tensor", "input") if p in idx), params[0])
    names = {"tensor": tensor_name, "group": "group", "tag": "tag", "reduce": "reduceOp" if "reduceOp" in idx else "op",
             "root": "src", "out_splits": "output_split_sizes", "in_splits": "input_split_sizes"}
    where = {k: idx.get(v) for k, v in names.items()}

    def wrapper(*args, **kwargs):
        if getattr(_tls, "inside", False) or torch.compiler.is_compiling():
            return original(*args, **kwargs)
        get = lambda k, default=None: _arg(args, kwargs, where[k], names[k], default)  # noqa: E731
        group = get("group")
        group = dist.group.WORLD if group is None else group
        g = mon.group_by_name(funcol._resolve_group_name(group, get("tag", "")))
        tensor = get("tensor")
        rec = mon.begin(g, op, f"funcol.{name}", lambda: fingerprint.from_funcol(
            op, tensor, get("reduce"), get("root"), get("out_splits"), get("in_splits")))
        _tls.inside = True
        try:
            out = original(*args, **kwargs)
        except Exception as e:
            mon.failed(rec, e)
            raise
        finally:
            _tls.inside = False
        mon.issued(None, rec, None, None)  # functional collectives are waited in C++ (wait_tensor)
        return out
    return wrapper


def _shard_dim_alltoall(mon: Monitor, original):
    def wrapper(input, gather_dim, shard_dim, mesh, mesh_dim):
        if getattr(_tls, "inside", False) or torch.compiler.is_compiling():
            return original(input, gather_dim, shard_dim, mesh, mesh_dim)
        g = mon.group(mesh.get_group(mesh_dim))
        rec = mon.begin(g, "shard_dim_alltoall", "shard_dim_alltoall", lambda: dict(
            fingerprint.from_funcol("shard_dim_alltoall", input, None, None, None, None),
            root=f"gather_dim={gather_dim} shard_dim={shard_dim}"))
        _tls.inside = True
        try:
            out = original(input, gather_dim, shard_dim, mesh, mesh_dim)
        except Exception as e:
            mon.failed(rec, e)
            raise
        finally:
            _tls.inside = False
        mon.issued(None, rec, None, None)
        return out
    return wrapper


# -- install / uninstall --------------------------------------------------------------------------
def install(mon: Monitor) -> Patches:
    from torch._C._distributed_c10d import ProcessGroup, Work
    import torch.distributed._functional_collectives as funcol

    patches = Patches()
    for op in PG_OPS:
        if hasattr(ProcessGroup, op):  # the set differs across torch versions
            patches.replace(ProcessGroup, op, _pg_method(mon, op, getattr(ProcessGroup, op)))
    for name, start in (("_start_coalescing", True), ("_end_coalescing", False)):
        if hasattr(ProcessGroup, name):
            patches.replace(ProcessGroup, name, _coalescing(mon, start, getattr(ProcessGroup, name)))
    patches.replace(Work, "wait", _wait(mon, Work.wait))
    for name in FUNCOL_OPS:
        if callable(getattr(funcol, name, None)):
            patches.replace(funcol, name, _funcol(mon, funcol, name, getattr(funcol, name)))

    def patch_dtensor(module):
        if callable(getattr(module, "shard_dim_alltoall", None)):
            patches.replace(module, "shard_dim_alltoall", _shard_dim_alltoall(mon, module.shard_dim_alltoall))

    for modname in DTENSOR_MODULES:
        if modname in sys.modules:
            patch_dtensor(sys.modules[modname])
        else:
            patches.hooks.append(_AfterImport(modname, patch_dtensor))
            sys.meta_path.insert(0, patches.hooks[-1])
    return patches
