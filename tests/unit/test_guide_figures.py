"""docs/guide.md's pictures are what shoal's code draws today (`make docs` redraws them)."""

import re
from pathlib import Path

from shoal.report.guide_figures import main, stale

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_committed_guide_pictures_are_current():
    assert stale(DOCS / "img") == [], "run `make docs` and commit docs/img"


def test_every_picture_in_the_guide_exists_and_has_alt_text():
    guide = (DOCS / "guide.md").read_text()
    images = re.findall(r"!\[([^\]]*)\]\(([^)]+)\)", guide)
    assert len(images) >= 10
    for alt, path in images:
        assert alt.strip() and (DOCS / path).is_file(), path


def test_the_check_fails_on_a_stale_picture(tmp_path):
    img = tmp_path / "img"
    img.mkdir()
    text = (DOCS / "img" / "figures.json").read_text()
    (img / "figures.json").write_text(re.sub(r'"bubble": 0\.272727', '"bubble": 0.25', text, count=1))
    for svg in (DOCS / "img").glob("*.svg"):
        (img / svg.name).write_text("")
    assert stale(img) == ["pipeline_1f1b"]
    assert main(["--check", str(img)]) == 1
