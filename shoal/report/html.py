"""One self-contained HTML page: every figure inline (base64 PNG), no script, no fetch, printable."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path

CSS = """
body { font: 15px/1.45 system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; } td, th { padding: .2em .8em; border-bottom: 1px solid #eee; text-align: left; }
figure { margin: 1em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: .9em; color: #555; margin-top: .3em; }
.note { background: #fff6e0; padding: .5em .8em; border-left: 4px solid #e0a000; }
code { background: #f3f3f3; padding: 0 .25em; }
@media print { body { margin: 0; max-width: none; } figure, table { break-inside: avoid; } h2 { break-after: avoid; } }
"""


PAGE = "index.html"
PAGE_MARK = "<title>shoal "
"""Every page render() writes has a title beginning "shoal ": index.html is too common a name to
trust without it (shoal.files.carries_mark)."""
OWN_FILES = ((PAGE, PAGE_MARK), "*.png", "*.svg")
"""What a report folder holds (the run report's, `plan --report`'s and `plan --figures`'): a folder
holding anything else is not one, and a report there would overwrite or mix with it."""


@dataclass
class Figure:
    png: Path
    alt: str
    caption: str


@dataclass
class Section:
    id: str
    title: str
    paragraphs: list[str] = field(default_factory=list)
    """HTML-escaped here: plain text in, one <p> each."""
    table: list[tuple[str, str]] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def render(title: str, sections: list[Section]) -> str:
    e = html.escape
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           # No request may leave the page: images are data: URLs, and the policy forbids the rest.
           '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; img-src data:; '
           'style-src \'unsafe-inline\'">',
           f"<title>{e(title)}</title><style>{CSS}</style></head><body>", f"<h1>{e(title)}</h1>",
           "<nav><ul>" + "".join(f'<li><a href="#{s.id}">{e(s.title)}</a></li>' for s in sections) + "</ul></nav>"]
    for s in sections:
        out.append(f'<section id="{s.id}"><h2>{e(s.title)}</h2>')
        out += [f'<p class="note">{e(n)}</p>' for n in s.notes]
        out += [f"<p>{e(p)}</p>" for p in s.paragraphs]
        if s.table:
            out.append("<table>" + "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in s.table) + "</table>")
        for f in s.figures:
            data = base64.b64encode(f.png.read_bytes()).decode()
            out.append(f'<figure id="fig-{f.png.stem}"><img src="data:image/png;base64,{data}" alt="{e(f.alt, quote=True)}">'
                       f"<figcaption>{e(f.caption)} (files: <code>{e(f.png.name)}</code>, "
                       f"<code>{e(f.png.with_suffix('.svg').name)}</code>)</figcaption></figure>")
        out.append("</section>")
    out.append("</body></html>")
    return "\n".join(out)
