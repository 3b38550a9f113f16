"""Tests for tformer_cli.report.picture: a ``--save`` file is written as its suffix says (and an
unknown suffix fails in one line before any work), one install advice when matplotlib is
missing, and text and attribute values escaped so that the SVG parses back to the same text."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tformer_cli.errors import TformerError
from tformer_cli.report.attention import view as attention_view
from tformer_cli.report.picture import (
    check_picture,
    element,
    html_page,
    save_picture,
    svg_document,
    text,
    title,
)
from tformer_cli.report.show import show_run

SVG = "{http://www.w3.org/2000/svg}"
NASTY = 'l\'homme & <b>"x"</b>'  # every character that SVG/HTML must escape


def save(path: Path) -> list[str]:
    """Save ``path`` with each writer saying which it is; the writers called, in order."""
    called: list[str] = []

    def writer(name: str) -> str:
        called.append(name)
        return name

    save_picture(
        path,
        svg=lambda: writer("svg"),
        html=lambda: writer("html"),
        png=lambda tmp: tmp.write_text(writer("png")),
    )
    return called


@pytest.mark.parametrize(
    ("name", "writer"),
    [("a.svg", "svg"), ("a.html", "html"), ("a.htm", "html"), ("A.SVG", "svg"), ("a.png", "png")],
)
def test_the_suffix_picks_the_writer(tmp_path, name, writer):
    if writer == "png":
        pytest.importorskip("matplotlib")
    assert save(tmp_path / "out" / name) == [writer]
    assert (tmp_path / "out" / name).read_text() == writer
    assert [p.name for p in (tmp_path / "out").iterdir()] == [name]  # no temporary file left


def test_an_unknown_suffix_fails_in_one_line_before_any_work(tmp_path):
    for name in ("a.pdf", "a", "a.svg.txt"):
        with pytest.raises(TformerError, match=r"^--save .*: use a \.svg, \.html or \.png file"):
            save(tmp_path / name)
    assert not list(tmp_path.iterdir())
    check_picture(None)  # nothing asked: nothing to check


def test_without_matplotlib_every_png_gives_one_install_advice(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    messages = []
    for fail in (
        lambda: check_picture(tmp_path / "a.png"),
        lambda: save(tmp_path / "a.PNG"),
        lambda: show_run(tmp_path / "run", None, save=tmp_path / "c.png"),
        lambda: attention_view.inspect_attention(
            "a b", tmp_path / "missing", attention_view.AttentionRequest(), None, None,
            save=tmp_path / "attn.png",
        ),
    ):  # fmt: skip
        with pytest.raises(TformerError) as caught:
            fail()
        messages.append(str(caught.value))
    assert len(set(messages)) == 1 and "\n" not in messages[0]
    assert "pip install -e '.[plot]'" in messages[0] and "pip install matplotlib" in messages[0]
    assert not list(tmp_path.glob("*.png")) and not list(tmp_path.glob("*.PNG"))


def test_text_and_attributes_are_escaped_and_parse_back():
    body = [
        text(10, 20.25, NASTY, 11, text_anchor="end"),
        element("rect", title(NASTY), x=1, y=2.04, data_run=NASTY, fill="#fff"),
        element("circle", cx=0.5, cy=3, r=2.6),
    ]
    doc = svg_document(120, 40, body, style="rect{shape-rendering:crispEdges}")
    root = ET.fromstring(doc)
    assert root.tag == f"{SVG}svg" and root.get("width") == "120"
    label = root.find(f"{SVG}text")
    assert label.text == NASTY and label.get("y") == "20.2" and label.get("text-anchor") == "end"
    rects = root.findall(f"{SVG}rect")  # the white background, then ours
    assert rects[1].get("data-run") == NASTY and rects[1].findtext(f"{SVG}title") == NASTY
    assert rects[1].get("x") == "1" and rects[1].get("y") == "2.0"
    assert doc.count("<circle cx='0.5' cy='3' r='2.6'/>") == 1  # no content: self-closed
    assert "data-run='l&apos;homme &amp; &lt;b&gt;\"x\"&lt;/b&gt;'" in doc  # ' cannot end it


def test_the_html_page_escapes_its_title_and_keeps_the_body():
    page = html_page(NASTY, "<p>body</p>\n", "p{color:red}")
    assert page.startswith("<!doctype html>") and page.endswith("</body></html>\n")
    assert page.count("l'homme &amp; &lt;b&gt;") == 2  # the title and the heading
    assert "<p>body</p>" in page and "p{color:red}</style>" in page
    assert "src=" not in page and "<script" not in page
