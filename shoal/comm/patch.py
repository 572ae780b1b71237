"""ONE patch/undo layer: where collectives are caught. Observers decide what happens.

The byte counter (counter.py) and the debug monitor (shoal/debug/intercept.py) both `attach` an
Observer; each door below is patched while at least one observer listens at it, and put back
when the last one detaches. Everything is patched in place, so code that already imported
torch.distributed sees it.

Doors (the `door` argument observers get):
* "pg": ProcessGroup methods (ops.PG_METHODS). Every Python-level c10d API — dist.all_reduce,
  all_gather_into_tensor, reduce_scatter_tensor, all_to_all(_single), broadcast, barrier,
  send/recv/isend/irecv, batch_isend_irecv and P2POp, the *_object collectives — ends in one, as do
  FSDP2 (all_gather_single / reduce_scatter_single), DDP's Python comm hook and pipelining's P2P
  batches. Patching methods rather than API functions keeps `P2POp.op is dist.isend` checks intact.
  target: the ProcessGroup; result: the Work.
* "coalesce": ProcessGroup._start_coalescing / _end_coalescing (NCCL-style batches: one Work at the end).
* "wait": Work.wait, where async work blocks. target: the Work.
* "funcol": torch.distributed._functional_collectives functions (ops.FUNCOL), which DTensor and
  tensor parallelism call; they go straight to C++ ops, bypassing ProcessGroup methods. They call
  each other: only the outermost call reaches observers. target: a FuncolCall (named arguments).
* "dtensor": DTensor's shard_dim_alltoall, patched when DTensor is imported. target: a FuncolCall.
* "op": the torch.ops._c10d_functional packets (ops.FUNCTIONAL_OPS) the functions above end in,
  including from their Python backward formulas (which "funcol" misses). target: None.

Not covered (they never come back to Python): collectives issued from C++ — DDP's built-in bucket
all-reduce (see shoal.debug.watch_ddp) — and anything inside a torch.compile'd graph.

Cost: a door with one observer whose `before` returns None (the byte counter) adds one Python call
and a loop of one to each collective — the counter's price before this layer existed. A
TorchDispatchMode would put every aten op of the step through Python (5% of a tiny model's step
on CPU, bench/bench_vs_plain.py).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import inspect
import sys
import threading

import torch

from shoal.comm import ops

DOORS = ("pg", "coalesce", "wait", "funcol", "dtensor", "op")
_MISSING = object()


class Observer:
    """Listens at `doors`. `before` runs ahead of the original call; when it returns a token other
    than None, `after(token, result)` or `failed(token, exc)` follows."""

    doors: tuple[str, ...] = ()

    def before(self, door: str, name: str, target, args: tuple, kwargs: dict):
        return None

    def after(self, token, result) -> None:
        pass

    def failed(self, token, exc: BaseException) -> None:
        pass


class FuncolCall:
    """A functional collective's arguments by role, whatever the function names them."""

    __slots__ = ("funcol", "name", "args", "kwargs", "_where")

    def __init__(self, funcol, name: str, args: tuple, kwargs: dict, where: dict):
        self.funcol, self.name, self.args, self.kwargs, self._where = funcol, name, args, kwargs, where

    def get(self, role: str, default=None):
        """role: tensor, group, tag, reduce, root, out_splits, in_splits (or, for dtensor, its own names)."""
        param, index = self._where.get(role, (role, None))
        if param in self.kwargs:
            return self.kwargs[param]
        if index is not None and index < len(self.args):
            return self.args[index]
        return default


_ROLE_PARAMS = {"group": ("group",), "tag": ("tag",), "reduce": ("reduceOp", "op"), "root": ("src",),
                "out_splits": ("output_split_sizes",), "in_splits": ("input_split_sizes",),
                "tensor": ("self", "inputs", "tensor", "input")}


def _where(fn) -> dict[str, tuple[str, int | None]]:
    """role -> (parameter name, position) for one function's signature."""
    params = list(inspect.signature(fn).parameters)
    idx = {p: i for i, p in enumerate(params)}
    where = {p: (p, i) for p, i in idx.items()}
    for role, names in _ROLE_PARAMS.items():
        name = next((p for p in names if p in idx), params[0] if role == "tensor" else names[0])
        where[role] = (name, idx.get(name))
    return where


# -- the registry ------------------------------------------------------------------------------
_lock = threading.Lock()
# door -> [tuple of observers]: wrappers hold the one-element list and read the tuple, which
# attach/detach replace whole, so a collective on another thread never sees a half-changed list
_listeners: dict[str, list[tuple[Observer, ...]]] = {door: [()] for door in DOORS}
_installed: dict[str, "_Patches"] = {}
_tls = threading.local()  # funcol/dtensor: only the outermost call reaches observers


def attach(observer: Observer) -> None:
    """Start calling `observer` at its doors (patching a door when it gets its first listener)."""
    with _lock:
        for door in observer.doors:
            _listeners[door][0] += (observer,)
            if door not in _installed:
                _installed[door] = _INSTALL[door]()


def detach(observer: Observer) -> None:
    """Stop calling `observer`; a door nobody listens at any more gets its originals back."""
    with _lock:
        for door in observer.doors:
            _listeners[door][0] = tuple(o for o in _listeners[door][0] if o is not observer)
            if not _listeners[door][0] and door in _installed:
                _installed.pop(door).undo()


def patched_doors() -> list[str]:
    return sorted(_installed)


# -- wrappers ----------------------------------------------------------------------------------
def _around(door: str, name: str, listeners: tuple[Observer, ...], target, args: tuple, kwargs: dict, call):
    """Call the observers, then `call()`; observers that returned a token hear how it ended."""
    tokens = None
    for o in listeners:
        token = o.before(door, name, target, args, kwargs)
        if token is not None:
            if tokens is None:
                tokens = []
            tokens.append((o, token))
    if tokens is None:
        return call()
    try:
        result = call()
    except BaseException as e:
        for o, token in tokens:
            o.failed(token, e)
        raise
    for o, token in tokens:
        o.after(token, result)
    return result


def _method(door: str, name: str, original):
    cell = _listeners[door]

    def method(self, *args, **kwargs):
        listeners = cell[0]
        if len(listeners) == 1:  # the common case, spelled out: this is on every collective's path
            o = listeners[0]
            token = o.before(door, name, self, args, kwargs)
            if token is None:
                return original(self, *args, **kwargs)
            try:
                result = original(self, *args, **kwargs)
            except BaseException as e:
                o.failed(token, e)
                raise
            o.after(token, result)
            return result
        return _around(door, name, listeners, self, args, kwargs, lambda: original(self, *args, **kwargs))
    return method


def _outermost(door: str, name: str, funcol, original, where: dict):
    cell = _listeners[door]

    def wrapper(*args, **kwargs):
        if getattr(_tls, "inside", False) or torch.compiler.is_compiling():
            return original(*args, **kwargs)

        def call():
            _tls.inside = True
            try:
                return original(*args, **kwargs)
            finally:
                _tls.inside = False
        return _around(door, name, cell[0], FuncolCall(funcol, name, args, kwargs, where), args, kwargs, call)
    return wrapper


class _Packet:
    """Stands in for an op packet (torch.ops._c10d_functional.X): tells observers, delegates the rest."""

    def __init__(self, name: str, packet):
        self._name, self._packet, self._cell = name, packet, _listeners["op"]

    def __call__(self, *args, **kwargs):
        for o in self._cell[0]:
            o.before("op", self._name, None, args, kwargs)  # nobody needs more than a look here
        return self._packet(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._packet, name)


# -- install / undo ----------------------------------------------------------------------------
class _Patches:
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


def _install_pg() -> _Patches:
    from torch._C._distributed_c10d import ProcessGroup

    p = _Patches()
    for name in ops.PG_METHODS:
        if hasattr(ProcessGroup, name):  # the set differs across torch versions
            p.replace(ProcessGroup, name, _method("pg", name, getattr(ProcessGroup, name)))
    return p


def _install_coalesce() -> _Patches:
    from torch._C._distributed_c10d import ProcessGroup

    p = _Patches()
    for name in ops.COALESCING:
        if hasattr(ProcessGroup, name):
            p.replace(ProcessGroup, name, _method("coalesce", name, getattr(ProcessGroup, name)))
    return p


def _install_wait() -> _Patches:
    from torch._C._distributed_c10d import Work

    p = _Patches()
    p.replace(Work, "wait", _method("wait", "wait", Work.wait))
    return p


_signatures: dict = {}  # function -> _where(function): computed once, doors come and go


def _install_funcol() -> _Patches:
    import torch.distributed._functional_collectives as funcol

    p = _Patches()
    for name in ops.FUNCOL:
        fn = getattr(funcol, name, None)
        if callable(fn):
            where = _signatures.get(fn) or _signatures.setdefault(fn, _where(fn))
            p.replace(funcol, name, _outermost("funcol", name, funcol, fn, where))
    return p


def _install_dtensor() -> _Patches:
    p = _Patches()

    def patch(module):
        fn = getattr(module, "shard_dim_alltoall", None)
        if callable(fn):
            where = _signatures.get(fn) or _signatures.setdefault(fn, _where(fn))
            p.replace(module, "shard_dim_alltoall", _outermost("dtensor", "shard_dim_alltoall", None, fn, where))

    for modname in ops.DTENSOR_MODULES:
        if modname in sys.modules:
            patch(sys.modules[modname])
        else:
            p.hooks.append(_AfterImport(modname, patch))
            sys.meta_path.insert(0, p.hooks[-1])
    return p


def _install_op() -> _Patches:
    p = _Patches()
    for name in ops.FUNCTIONAL_OPS:
        # hasattr: an op newer than the installed torch (isend/irecv came after 2.11) is not there to watch
        if hasattr(torch.ops._c10d_functional, name):
            p.replace(torch.ops._c10d_functional, name, _Packet(name, getattr(torch.ops._c10d_functional, name)))
    return p


_INSTALL = {"pg": _install_pg, "coalesce": _install_coalesce, "wait": _install_wait, "funcol": _install_funcol,
            "dtensor": _install_dtensor, "op": _install_op}
