"""The collective checker: ranks compare fingerprints before a collective runs.

Collectives: each group gets a private gloo group over the same ranks (a "shadow", built lazily,
outside torch.distributed's bookkeeping). Before collective #k every rank all-gathers one 64-bit
hash of its fingerprint's compared part on the shadow: one small exchange, no store traffic, and
it cannot deadlock on the user's collective because it never touches the user's group. Equal
hashes: go on (all_to_all also exchanges its split sizes and cross-checks them). Different:
every rank posts its full fingerprint to the store and raises the same side-by-side table, before
the collective is issued, so nothing hangs. A rank that does not arrive makes the shadow exchange
time out (or fail, when it exited); the others name it and say where it is (its progress record).
PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL wraps every collective with a monitored barrier plus
fingerprint all-gathers on a helper gloo group; one all-gather of 8 bytes is what we pay instead.

Point-to-point: the n-th send from i to j must match the n-th recv on j from i. Each side posts
its fingerprint to the store at issue and compares in `Work.wait()`, where waiting for the peer's
fingerprint cannot add a deadlock: the transfer itself cannot complete before the peer has issued
its half (gloo and NCCL sends wait for the receiver).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Work

from shoal.debug import fingerprint, records, tables
from shoal.debug.channel import Channel
from shoal.debug.state import CollectiveRecord


class CollectiveMismatchError(RuntimeError):
    """Ranks disagreed on a collective, or one never arrived. Raised on every rank that saw it."""

    def __init__(self, message: str, *, group: str, seq: int, differ: list[str], ranks: list[int]):
        super().__init__(message)
        self.group, self.seq, self.differ, self.ranks = group, seq, differ, ranks


class GroupInfo:
    """What the checker needs to know about a process group, computed once per group."""

    __slots__ = ("name", "desc", "ranks", "index", "size")

    def __init__(self, name: str, desc: str, ranks: list[int], index: int):
        self.name, self.desc, self.ranks, self.index, self.size = name, desc, ranks, index, len(ranks)

    def title(self) -> str:
        desc = f" ({self.desc})" if self.desc and self.desc not in (self.name, "undefined") else ""
        return f"group {self.name}{desc}, ranks {tables.rank_list(self.ranks)}"


class Pending:
    """A posted point-to-point fingerprint waiting for its peer's, verified in Work.wait()."""

    __slots__ = ("group", "rec", "mine", "theirs", "send", "peer")

    def __init__(self, group: GroupInfo, rec: CollectiveRecord, mine: dict, theirs: str, send: bool, peer: int):
        self.group, self.rec, self.mine, self.theirs, self.send, self.peer = group, rec, mine, theirs, send, peer


def _full(fp: dict, rec: CollectiveRecord) -> dict:
    return dict(fp, api=rec.api, site=rec.site or "", via=rec.via or "")


_serials = itertools.count()  # a new checker (enable() again) must not rendezvous on an old one's keys


class Checker:
    def __init__(self, channel: Channel, timeout_s: float):
        self.channel, self.timeout_s = channel, timeout_s
        self.serial = next(_serials)
        self._shadows: dict[str, _Shadow] = {}

    # -- collectives ------------------------------------------------------------------------------
    def collective(self, g: GroupInfo, rec: CollectiveRecord, fp: dict) -> None:
        """Return when all ranks of `g` agree on collective #rec.seq; raise when they do not."""
        a2a = fp["op"] in ("all_to_all_single", "all_to_all")
        try:
            shadow = self._shadow(g)
            hashes = shadow.gather([_hash(fingerprint.key(fp))])
            split_errors = []
            if a2a and len({h[0] for h in hashes}) == 1:
                ins, outs = fingerprint.splits(fp, g.size)
                rows = shadow.gather(ins + outs)
                split_errors = fingerprint.split_errors([r[:g.size] for r in rows], [r[g.size:] for r in rows])
        except RuntimeError as e:  # gloo timed out (a rank never came) or a peer's connection closed
            self._missing(g, rec, fp, e)
        if len({h[0] for h in hashes}) > 1 or split_errors:
            self._mismatch(g, rec, fp, split_errors)

    def _shadow(self, g: GroupInfo) -> "_Shadow":
        shadow = self._shadows.get(g.name)
        if shadow is None:
            shadow = self._shadows[g.name] = _Shadow(self.channel, f"shadow/{self.serial}/{g.name}/", g, self.timeout_s)
        return shadow

    def _post(self, g: GroupInfo, rec: CollectiveRecord, fp: dict) -> list[str]:
        base = f"c/{g.name}/{rec.seq}/f"
        self.channel.set(f"{base}{g.index}", json.dumps(_full(fp, rec)))
        return [f"{base}{i}" for i in range(g.size)]

    def _mismatch(self, g: GroupInfo, rec: CollectiveRecord, fp: dict, split_errors: list[str]) -> None:
        keys = self._post(g, rec, fp)  # every rank saw the same hashes, so every rank posts
        values = self.channel.get_all(keys, timeout_s=10.0) or []
        fulls = [json.loads(v) for v in values] or [_full(fp, rec)]
        by_rank = {g.ranks[i]: f for i, f in enumerate(fulls)}
        differ = fingerprint.differing(fulls)
        what = ", ".join(differ + (["split sizes"] if split_errors else [])) or "the fingerprint"
        title = f"shoal: collective mismatch at collective #{rec.seq} of {g.title()}: ranks disagree on {what}"
        footer = "".join(f"  {e}\n" for e in split_errors[:8]) + _HINT
        if len({f["site"] for f in fulls}) > 1 and "op" not in differ:
            footer = _SKIP_HINT + "\n" + footer
        raise CollectiveMismatchError(tables.render(title, by_rank, differ, footer=footer),
                                      group=g.name, seq=rec.seq, differ=differ, ranks=g.ranks)

    def _missing(self, g: GroupInfo, rec: CollectiveRecord, fp: dict, error: Exception) -> None:
        """Some rank did not take part in the shadow exchange: say who, and where it is instead."""
        keys = self._post(g, rec, fp)
        time.sleep(1.0)  # ranks that arrived late time out late; give their posts a moment
        present = self.channel.present(keys)
        progress = records.read(self.channel, g.ranks)
        by_rank, missing = {}, []
        for i, r in enumerate(g.ranks):
            seen = progress.get(r, {}).get("seqs", {}).get(g.name, 0) >= rec.seq
            if present[i]:
                by_rank[r] = dict(json.loads(self.channel.get_all([keys[i]], timeout_s=5.0)[0]), where="here, waiting")
            elif seen and not progress[r].get("exit"):
                by_rank[r] = {"where": "reached this collective late: " + records.where(progress[r])}
            else:
                missing.append(r)
                by_rank[r] = {"where": records.where(progress.get(r))}
        if not missing:  # everyone came after all: the exchange itself failed
            raise error
        who = f"rank {missing[0]}" if len(missing) == 1 else f"ranks {tables.rank_list(missing)}"
        title = (f"shoal: collective #{rec.seq} of {g.title()}: {who} did not arrive within "
                 f"{self.timeout_s:g} s (skipped a collective, exited, or stuck before it)")
        cause = records.short_error(error)
        raise CollectiveMismatchError(
            tables.render(title, by_rank, [], suffix={r: "(missing)" for r in missing},
                          footer=f"  (the check's own exchange ended with: {cause})\n{_HINT}"),
            group=g.name, seq=rec.seq, differ=["missing"], ranks=g.ranks) from None

    # -- point-to-point ---------------------------------------------------------------------------
    def post_p2p(self, g: GroupInfo, rec: CollectiveRecord, fp: dict, send: bool, peer_index: int) -> Pending:
        """Post this side of a send/recv; the returned Pending is verified when its Work is waited."""
        src, dst = (g.index, peer_index) if send else (peer_index, g.index)
        base = f"p/{g.name}/{src}>{dst}/{rec.seq}/"  # rec.seq counts messages on this (src, dst) pair
        mine = dict(_full(fp, rec), peer=("→ " if send else "← ") + f"rank {g.ranks[peer_index]}")
        self.channel.set(base + ("s" if send else "r"), json.dumps(mine))
        return Pending(g, rec, mine, base + ("r" if send else "s"), send, g.ranks[peer_index])

    def verify_p2p(self, p: Pending) -> None:
        values = self.channel.get_all([p.theirs])
        me = p.group.ranks[p.group.index]
        n, kind = p.rec.seq, "send" if p.send else "recv"
        if values is None:
            by_rank = {me: dict(p.mine, where="here, waiting")}
            rec = records.read(self.channel, [p.peer]).get(p.peer)
            by_rank[p.peer] = {"where": records.where(rec)}
            other = "recv" if p.send else "send"
            title = (f"shoal: {kind} #{n} on rank {me} ({p.group.title()}): rank {p.peer} did not post the "
                     f"matching {other} within {self.timeout_s:g} s")
            raise CollectiveMismatchError(tables.render(title, by_rank, [], suffix={p.peer: "(missing)"}, footer=_HINT),
                                          group=p.group.name, seq=n, differ=["missing"], ranks=[me, p.peer])
        theirs = json.loads(values[0])
        self.channel.discard([p.theirs])
        differ = [f for f in ("shapes", "dtypes", "tag") if p.mine.get(f) != theirs.get(f)]
        if differ:
            sender, receiver = (me, p.peer) if p.send else (p.peer, me)
            title = (f"shoal: point-to-point mismatch on message #{n} from rank {sender} to rank {receiver} "
                     f"({p.group.title()}): send and recv disagree on {', '.join(differ)}")
            by_rank = {me: p.mine, p.peer: theirs}
            suffix = {sender: "(send)", receiver: "(recv)"}
            raise CollectiveMismatchError(tables.render(title, by_rank, differ, suffix=suffix, footer=_HINT),
                                          group=p.group.name, seq=n, differ=differ, ranks=[sender, receiver])


_WAIT = Work.wait  # the unpatched wait: the checker's own exchange is not a user collective


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


class _Shadow:
    """A private gloo group over the ranks of a user group, for the checker's own exchanges.

    Built directly from ProcessGroupGloo (not dist.new_group), so it changes nothing in
    torch.distributed's group numbering; construction is a rendezvous of the group's ranks
    through the store, which every rank reaches at its first collective on that group.
    """

    def __init__(self, channel: Channel, prefix: str, g: GroupInfo, timeout_s: float):
        from torch.distributed import ProcessGroupGloo

        store = dist.PrefixStore(prefix, channel.new_client())
        self.pg = ProcessGroupGloo(store, g.index, g.size, timedelta(seconds=timeout_s))
        self.size = g.size
        self._one, self._all = torch.zeros(1, dtype=torch.int64), torch.zeros(g.size, dtype=torch.int64)
        self._one_np, self._all_np = self._one.numpy(), self._all.numpy()  # element access without dispatch

    def gather(self, values: list[int]) -> list[list[int]]:
        """All-gather a few int64s from every rank: row i is group rank i's values."""
        if len(values) == 1:  # the per-collective hash: reuse buffers
            self._one_np[0] = values[0]
            _WAIT(self.pg._allgather_base(self._all, self._one))
            return [[v] for v in self._all_np.tolist()]
        inp = torch.tensor(values, dtype=torch.int64)
        out = torch.empty(self.size * len(values), dtype=torch.int64)
        _WAIT(self.pg._allgather_base(out, inp))
        return out.view(self.size, len(values)).tolist()


_HINT = ("  Raised on every rank involved before the collective ran, so nothing hung. "
         "Ranks must issue the same collectives in the same order with matching tensors.")
_SKIP_HINT = ("  The ranks reached this collective from different lines: one of them probably "
              "skipped or added a collective before this one.")
