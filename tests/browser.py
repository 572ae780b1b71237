"""A real headless browser for the report tests: Debian's chromium, driven by its command-line flags.

`load(page)` opens a file:// page once with a network log and the console on stderr, and returns
what the tests check: the DOM after load, the page's own network requests (the browser's
background traffic to its vendor is told apart by its network isolation key, which for the page's
requests is file://), the console messages, and a screenshot.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-default-apps", "--disable-extensions", "--hide-scrollbars"]


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class Loaded:
    dom: str
    requests: list[str]
    console: list[str]
    screenshot: Path


def load(page: Path, work: Path, width: int = 1100, height: int = 3000) -> Loaded:
    exe = chromium()
    assert exe, "chromium is not installed (make's set-up installs it)"
    work.mkdir(parents=True, exist_ok=True)
    url = page.resolve().as_uri()
    profile = ["--user-data-dir=" + str(work / "profile")]
    net = work / "net.json"
    r = subprocess.run([exe, *FLAGS, *profile, "--enable-logging=stderr", "--v=0", f"--log-net-log={net}",
                        "--virtual-time-budget=3000", "--dump-dom", url], capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr[-2000:]
    console = [line for line in r.stderr.splitlines() if ":CONSOLE" in line]
    shot = work / "screenshot.png"
    s = subprocess.run([exe, *FLAGS, *profile, f"--screenshot={shot}", f"--window-size={width},{height}", url],
                       capture_output=True, text=True, timeout=90)
    assert s.returncode == 0 and shot.is_file(), s.stderr[-2000:]
    return Loaded(r.stdout, page_requests(net), console, shot)


def page_requests(netlog: Path) -> list[str]:
    """URLs the page itself asked the network for (not the browser's own update and sync traffic)."""
    text = netlog.read_text()
    if not text.rstrip().endswith("}"):  # the log of a browser that exits may miss its closing brackets
        text = text.rstrip().rstrip(",") + "]}"
    log = json.loads(text)
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return sorted({e["params"]["url"] for e in log["events"] if e["type"] == start
                   and "file://" in e.get("params", {}).get("network_isolation_key", "")})


def blank(png: Path) -> bool:
    """Whether a screenshot is one flat colour."""
    from PIL import Image

    with Image.open(png) as im:
        colours = im.convert("RGB").getcolors(maxcolors=64)  # None: more than 64 colours
    return colours is not None and len(colours) <= 2


def figures(dom: str) -> list[tuple[str, str]]:
    """(alt text, caption) of each <figure> in the DOM."""
    out = []
    for body in re.findall(r"<figure\b.*?</figure>", dom, flags=re.S):
        alt = re.search(r'<img[^>]*\salt="([^"]*)"', body)
        cap = re.search(r"<figcaption>(.*?)</figcaption>", body, flags=re.S)
        out.append((alt.group(1) if alt else "", re.sub("<[^>]+>", "", cap.group(1)).strip() if cap else ""))
    return out
