"""The README stays a front page (under 250 lines) and every page it links to exists."""

from __future__ import annotations

import re

from conftest import REPO


def test_readme_is_short_and_its_links_resolve() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) < 250
    targets = re.findall(r"\]\((?!https?:|#)([^)#]+)", text)
    assert "docs/screenshot.svg" in targets and len(targets) >= 10
    missing = [t for t in targets if not (REPO / t).exists()]
    assert missing == []


def test_docs_link_to_pages_that_exist() -> None:
    for page in sorted((REPO / "docs").glob("*.md")):
        for target in re.findall(r"\]\((?!https?:|#)([^)#]+)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name}: {target}"
