"""The README and docs/ point only at things that exist: every local link's file, and every anchor into a docs
page (the site build, `mkdocs build --strict` in CI, checks the links between docs pages; this checks the
README's, which the site does not include)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """The ids MkDocs gives a page's headings: lower case, punctuation dropped, spaces as dashes."""
    out = set()
    for line in page.read_text().splitlines():
        if line.startswith("#") and not line.startswith("#!"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"\s+", "-", re.sub(r"[^\w\s-]", "", title)))
    return out


def test_every_local_link_of_the_readme_resolves():
    text = (ROOT / "README.md").read_text()
    links = [link for link in LINK.findall(text) if not link.startswith(("http://", "https://", "mailto:"))]
    assert any(link.startswith("docs/") for link in links)  # the README hands the rest to the docs pages
    for link in links:
        path, _, anchor = link.partition("#")
        target = ROOT / path if path else ROOT / "README.md"
        assert target.exists(), f"README links to {link}: no such file"
        if anchor and target.suffix == ".md":
            assert anchor in anchors(target), f"README links to {link}: no such heading"


def test_the_readme_is_the_first_five_minutes():
    # a newcomer's page: install, quick start, the commands and exit codes; everything else in docs/
    assert len((ROOT / "README.md").read_text().splitlines()) < 200


def test_every_docs_page_is_in_the_site_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert pages and all(f": {page}" in nav for page in pages), pages
