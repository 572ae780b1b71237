"""Side-by-side tables for the checker's errors: one column per distinct behaviour, one row per field.

Pure functions over fingerprints (dicts of strings), so they are tested without processes.
Ranks that did exactly the same thing share a column, which keeps a 512-rank mismatch readable.
"""

from __future__ import annotations

MAX_COLUMNS = 6
ROWS = (  # (field, label) in display order; a row is shown when any column has a value
    ("api", "op"), ("peer", "peer"), ("shapes", "shapes"), ("dtypes", "dtypes"), ("reduce", "reduce op"),
    ("root", "root"), ("rows", "row shape"), ("in_splits", "in splits"), ("out_splits", "out splits"),
    ("tag", "tag"), ("site", "call site"), ("via", "via"), ("where", "where"),
)
# which displayed row a compared field lights up
_ROW_OF = {"op": "api"}


def rank_list(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    ranks = sorted(ranks)
    out, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(out)


def parse_rank_list(s: str) -> list[int]:
    """'0-2,5' -> [0, 1, 2, 5]."""
    out = []
    for part in filter(None, s.split(",")):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def columns(by_rank: dict[int, dict[str, str]]) -> list[tuple[list[int], dict[str, str]]]:
    """Group ranks with identical fingerprints; smallest groups (the odd ones out) last."""
    groups: dict[tuple, list[int]] = {}
    for rank in sorted(by_rank):
        groups.setdefault(tuple(sorted(by_rank[rank].items())), []).append(rank)
    cols = [(ranks, dict(items)) for items, ranks in groups.items()]
    cols.sort(key=lambda c: (-len(c[0]), c[0][0]))
    return cols


def render(title: str, by_rank: dict[int, dict[str, str]], differ: list[str], *,
           suffix: dict[int, str] | None = None, footer: str = "") -> str:
    """The table: a title line, a header of rank groups, a row per field, `*` on rows that differ."""
    cols = columns(by_rank)
    hidden = 0
    if len(cols) > MAX_COLUMNS:
        hidden, cols = len(cols) - MAX_COLUMNS, cols[:MAX_COLUMNS]
    suffix = suffix or {}

    def head(ranks: list[int]) -> str:
        s = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_list(ranks)}"
        return s + (f" {suffix[ranks[0]]}" if ranks[0] in suffix else "")

    marked = {_ROW_OF.get(f, f) for f in differ}
    rows = [(label + (" *" if field in marked else ""), [c[1].get(field, "") or "-" for c in cols])
            for field, label in ROWS if any(c[1].get(field) for c in cols)]
    header = ("field", [head(c[0]) for c in cols])
    width0 = max(len(r[0]) for r in rows + [header])
    widths = [max(len(header[1][i]), *(len(r[1][i]) for r in rows)) for i in range(len(cols))]

    def line(label: str, cells: list[str]) -> str:
        return "  " + label.ljust(width0) + " | " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    out = [title, line(*header), "  " + "-" * width0 + "-+-" + "-+-".join("-" * w for w in widths)]
    out += [line(label, cells) for label, cells in rows]
    if hidden:
        out.append(f"  ... and {hidden} more groups of ranks with other fingerprints")
    if differ:
        out.append("  (* = differs between ranks)")
    if footer:
        out.append(footer)
    return "\n".join(out)
