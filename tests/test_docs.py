"""The README and the pages under ``docs/`` link to files and headings that exist.

A page moved or a heading renamed leaves links that GitHub shows as working text and that lead
nowhere; read as the README's reader would follow them, every relative link must reach a file
of the repository, every ``#anchor`` a heading of the page it names, and every page under
``docs/`` must be reachable from the README. The names the porting guide lists as still
missing from Accelerate's API must be missing indeed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
# [text](target) and ![alt](target); the text may wrap onto the next line.
_LINK = re.compile(r"!?\[(?:[^\]]|\n)*?\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def _prose(text: str) -> str:
    """The page without fenced code and code spans, where brackets are not links."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()  # a link shows its text
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor of a markdown page, numbered as GitHub numbers repeated headings."""
    seen: dict[str, int] = {}
    found = set()
    for heading in _HEADING.findall(_FENCE.sub("", path.read_text())):
        slug = _slug(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """The relative links of ``path`` that lead to no file of ``root`` or no heading, as text."""
    broken = []
    for target in _LINK.findall(_prose(path.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists() or not linked.is_relative_to(root):
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.relative_to(root)}")
    return broken


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_heading(path: Path) -> None:
    assert not broken_links(path), f"{path.relative_to(ROOT)}: {broken_links(path)}"


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    reached, todo = set(), [ROOT / "README.md"]
    while todo:
        page = todo.pop()
        for target in _LINK.findall(_prose(page.read_text())):
            linked = (page.parent / target.partition("#")[0]).resolve()
            if linked.suffix == ".md" and linked.is_file() and linked not in reached:
                reached.add(linked)
                todo.append(linked)
    missing = [p.relative_to(ROOT) for p in PAGES[1:] if p.resolve() not in reached]
    assert not missing, f"docs pages no link leads to: {missing}"


def test_the_checker_sees_broken_links_and_anchors(tmp_path: Path) -> None:
    """The checks above pass only because the links work, not because none were found."""
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other page\n\n## The `pool`: workers that stay\n")
    page.write_text(
        "# Title\n\nSee [the other\npage](other.md#the-pool-workers-that-stay), "
        "[gone](missing.md), [bad anchor](other.md#nowhere), [here](#title), "
        "[lost](#no-such-heading) and [web](https://example.org/x).\n\n"
        "```python\nx = [not](a_link.md)\n```\n"
    )
    assert broken_links(page, root=tmp_path) == [
        "missing.md: no such file",
        "other.md#nowhere: no heading #nowhere in other.md",
        "#no-such-heading: no heading #no-such-heading in page.md",
    ]


def test_the_readme_links_every_notebook_and_each_has_its_own_number() -> None:
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    linked = {
        (ROOT / target).resolve()
        for target in _LINK.findall(_prose((ROOT / "README.md").read_text()))
    }
    assert not [p.name for p in notebooks if p.resolve() not in linked], "README lacks a notebook"
    numbers = [p.name.partition("_")[0] for p in notebooks]
    assert len(set(numbers)) == len(numbers), f"two notebooks share a number: {numbers}"


_MISSING_HEADING = "## Still missing from Accelerate's public API"
_BULLET = re.compile(r"^- (.*(?:\n  .*)*)", re.MULTILINE)  # an item and its indented lines
_NAME = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)`")


def missing_names(text: str) -> list[list[str]]:
    """The names in each item of the page's "still missing" list, one list per item."""
    _, found, rest = text.partition(_MISSING_HEADING + "\n")
    assert found, f"no heading {_MISSING_HEADING!r}"
    section = re.split(r"^#{1,6} ", rest, maxsplit=1, flags=re.MULTILINE)[0]
    return [_NAME.findall(item) for item in _BULLET.findall(section)]


def test_what_the_porting_guide_calls_missing_is_missing() -> None:
    import notebook_kit
    import notebook_kit.accelerator
    from notebook_kit import Accelerator

    items = missing_names((ROOT / "docs" / "porting_from_accelerate.md").read_text())
    assert len(items) >= 4 and all(items), f"every item names something: {items}"
    present = [
        name
        for names in items
        for name in names
        if hasattr(notebook_kit, name)
        or hasattr(notebook_kit.accelerator, name)
        or hasattr(Accelerator, name)
    ]
    assert not present, f"listed as missing from Accelerate's API, but they exist: {present}"


def test_the_missing_list_is_read_item_by_item() -> None:
    page = (
        "# P\n\n" + _MISSING_HEADING + "\n\nprose `not_read`\n\n- a: `one`, `two`\n"
        "  `three`\n- b: `four`\n\n## Next\n\n- `after`\n"
    )
    assert missing_names(page) == [["one", "two", "three"], ["four"]]
