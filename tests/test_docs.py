"""docs/math.md follows the code: every function and test it links to exists where it says."""

from __future__ import annotations

import re

from tests.conftest import REPO

MATH = REPO / "docs" / "math.md"


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
