"""The documentation holds together: docs/math.md follows the code (every function and test it
links to exists where it says), every relative link and #anchor in README.md and docs/ resolves
(GitHub's heading slugs), and the README stays a short front door."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO

MATH = REPO / "docs" / "math.md"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 300
FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def defined(path: str, name: str) -> bool:
    """Whether ``name`` (``f`` or ``Class.method``) is defined in the repository file ``path``."""
    text = (REPO / path).read_text(encoding="utf-8")
    return all(re.search(rf"^\s*(def|class) {part}\b", text, re.M) for part in name.split("."))


def test_every_function_in_the_math_table_exists_in_its_file():
    links = re.findall(
        r"\[`([\w/]+\.py): ([\w.]+)`\]\(\.\./(tformer_cli/[\w/]+\.py)\)", MATH.read_text()
    )
    assert len(links) >= 15
    for shown, name, target in links:
        assert target == f"tformer_cli/{shown}"
        assert defined(target, name), f"{name} is not defined in {target}"


def test_every_test_in_the_math_table_exists_in_its_file():
    checked = 0
    for row in MATH.read_text(encoding="utf-8").splitlines():
        current = None
        for path, name in re.findall(r"`(tests/[\w/]+\.py)?::(\w+)`", row):
            current = path or current
            assert current is not None, f"::{name} names no test file: {row[:60]}"
            assert defined(current, name), f"{name} is not in {current}"
            checked += 1
    assert checked >= 20


def prose_lines(path: Path) -> list[str]:
    """The lines of a Markdown file outside fenced code blocks, inline code spans removed."""
    lines, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
        elif not fenced:
            lines.append(re.sub(r"`[^`]*`", "", line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (link targets, code marks and emphasis dropped),
    lower-cased, every character but letters, digits, ``_``, ``-`` and spaces removed, each
    space a ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, repeated headings numbered as GitHub does."""
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading and not fenced:
            base = slug(heading.group(1))
            found.add(f"{base}-{seen[base]}" if base in seen else base)
            seen[base] = seen.get(base, 0) + 1
    return found


def test_slugs_follow_github():
    assert slug("`tformer train`") == "tformer-train"
    assert slug("Choosing the recipes: the trials") == "choosing-the-recipes-the-trials"
    assert slug("Scheduled sampling (the mitigation `tformer train` offers)") == (
        "scheduled-sampling-the-mitigation-tformer-train-offers"
    )
    assert slug("Does it help? A [link](x.md) & more") == "does-it-help-a-link--more"
    assert slug("Größe über_alles") == "größe-über_alles"


def test_every_relative_link_and_anchor_resolves():
    checked = 0
    for page in PAGES:
        for line in prose_lines(page):
            for target in LINK.findall(line):
                if re.match(r"[a-z][a-z+.-]*:", target):  # https:, mailto:
                    continue
                path, _, anchor = target.partition("#")
                linked = (page.parent / path).resolve() if path else page
                where = f"{page.relative_to(REPO)}: {target}"
                assert linked.exists(), f"{where}: no such file"
                if anchor:
                    assert linked.suffix == ".md", f"{where}: an anchor into a non-Markdown file"
                    assert anchor in anchors(linked), f"{where}: no such heading"
                checked += 1
    assert checked >= 100


def test_readme_is_a_short_front_door():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_docs_point_users_only_at_what_they_have():
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for stale in ("../shared", "DESIGN.md", "this session", "the issue's"):
            assert stale not in text, f"{page.relative_to(REPO)} mentions {stale!r}"
