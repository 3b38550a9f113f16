"""The page of ``tformer serve`` in a real browser: Playwright drives Debian's headless Chromium
against a uvicorn server on a free local port. Translate, read the n-best lists, click a target
token, check its heatmap against the server's weights, use the keyboard, and take screenshots at
desktop and phone widths (into docs/ with TFORMER_SAVE_SCREENSHOTS=1, for the README).

Skips, saying why, only where no Chromium is installed (``apt-get install chromium``).
TFORMER_SERVE_RUN=DIR serves that run instead of the tiny test model (for README pictures).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, skip_without

try:
    import uvicorn
    from playwright.sync_api import Page, sync_playwright
except ModuleNotFoundError as missing:
    skip_without("dev,serve", missing)

from tests.test_serve import shared_run
from tformer_cli.checkpoint import LoadedRun, load_run
from tformer_cli.config import DecodeConfig
from tformer_cli.decode.translate import translate_texts
from tformer_cli.serve import attention_record, create_app

BROWSERS = ("chromium", "google-chrome", "chromium-browser")  # Debian's first
CHROMIUM = os.environ.get("TFORMER_CHROMIUM") or next(
    filter(None, map(shutil.which, BROWSERS)), "/usr/bin/chromium"
)
pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).is_file(),
    reason="no Chromium: install Debian's `chromium` package (or set TFORMER_CHROMIUM)",
)
BROWSER_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-extensions",
    "--no-first-run",
]
# The tiny model reverses sequences of ten words; a real run gets real sentences.
WORD_TEXTS = ["one big red dog", "two small blue bird cat"]
TOY_TEXTS = ["the big dog sees a small cat .", "a young teacher sings under the red tree ."]
BEAM, NBEST = 4, 3
SIZES = {"desktop": (1280, 900), "phone": (390, 844)}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> LoadedRun:
    given = os.environ.get("TFORMER_SERVE_RUN")
    return load_run(Path(given) if given else shared_run(tmp_path_factory), "cpu")


@pytest.fixture(scope="module")
def server(run) -> Iterator[str]:
    """A real uvicorn server in a thread, on a free port of 127.0.0.1; yields its URL. It loads
    its own copy of the run: its model thread owns that model, and the tests read ``run`` from
    this thread while the page's requests run (attention recording is per-model state)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    own = load_run(run.run_dir, "cpu")
    config = uvicorn.Config(create_app(own), log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "uvicorn did not start"
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/"
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()


@pytest.fixture(scope="module")
def browser() -> Iterator:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        yield b
        b.close()


def open_page(browser, url: str, size: tuple[int, int]) -> tuple[Page, list[str]]:
    """A page at ``url`` with the viewport ``size``, and the list its errors go into."""
    page = browser.new_page(viewport={"width": size[0], "height": size[1]})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
    page.goto(url)
    page.locator("#model-info", has_text=re.compile(r"^run ")).wait_for()  # no eval: the CSP
    return page, errors


def translate(page: Page, texts: list[str]) -> None:
    """Type the texts and press Ctrl+Enter (the keyboard path), then wait for the maps."""
    page.fill("#beam", str(BEAM))
    page.fill("#nbest", str(NBEST))
    page.fill("#texts", "\n".join(texts))
    page.press("#texts", "Control+Enter")
    page.wait_for_selector("#tokens .token", timeout=20_000)


def shots_dir(tmp_path: Path) -> Path:
    return REPO / "docs" if os.environ.get("TFORMER_SAVE_SCREENSHOTS") == "1" else tmp_path


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return TOY_TEXTS if os.environ.get("TFORMER_SERVE_RUN") else WORD_TEXTS


def test_translate_shows_the_n_best_lists_of_translate(browser, server, run, texts):
    page, errors = open_page(browser, server, SIZES["desktop"])
    translate(page, texts)
    results = translate_texts(run, texts, DecodeConfig(beam=BEAM, nbest=NBEST))
    items = page.locator("#result-list > li.result")
    assert items.count() == len(texts)
    for i, r in enumerate(results):
        item = items.nth(i)
        assert item.locator(".source").inner_text() == r.source
        shown = item.locator(".nbest .hyp").all_inner_texts()
        assert shown == [t or "∅" for t in r.translations]
        scores = [float(s) for s in item.locator(".nbest .score").all_inner_texts()]
        assert scores == pytest.approx([h.score for h in r.hypotheses], abs=1e-3)
    assert page.locator("#status").inner_text().startswith(f"{len(texts)} sentences in")
    assert errors == []
    page.close()


def strip_weights(page: Page) -> list[float]:
    return [
        float(w)
        for w in page.eval_on_selector_all("#strip .chip", "cs => cs.map(c => c.dataset.w)")
    ]


def test_a_clicked_token_shows_its_attention_and_the_keyboard_moves_it(
    browser, server, run, texts, tmp_path
):
    page, errors = open_page(browser, server, SIZES["desktop"])
    translate(page, texts)
    maps = attention_record(run, texts[0], DecodeConfig(beam=BEAM))
    cross = maps["attention"]["cross"]
    layers, heads = len(cross["weights"]), len(cross["weights"][0])
    tokens = page.locator("#tokens .token")
    assert tokens.all_inner_texts() == cross["rows"]

    tokens.nth(1).click()  # layer = last, head = mean by default
    assert tokens.nth(1).get_attribute("aria-pressed") == "true"
    mean = [sum(h[1][j] for h in cross["weights"][-1]) / heads for j in range(len(cross["cols"]))]
    assert strip_weights(page) == pytest.approx(mean, abs=1e-5)
    assert page.locator("#strip .chip-token").all_inner_texts() == cross["cols"]
    rows = page.locator("#heatmap tbody tr")
    assert rows.count() == len(cross["rows"])
    selected = page.eval_on_selector_all(
        "#heatmap tr.selected td", "ts => ts.map(t => Number(t.dataset.w))"
    )
    assert sum(selected) == pytest.approx(1, abs=1e-4) and selected == pytest.approx(mean, abs=1e-5)
    assert page.locator("#entropy tbody tr").count() == heads + 1

    page.select_option("#head", label="1")  # one head, by the select (labels count from 1)
    assert strip_weights(page) == pytest.approx(cross["weights"][-1][0][1], abs=1e-5)
    assert page.locator("#entropy tr.selected th").inner_text() == "1"
    page.select_option("#layer", label="1")
    assert strip_weights(page) == pytest.approx(cross["weights"][0][0][1], abs=1e-5)

    page.locator("#tokens .token[aria-pressed=true]").focus()
    page.keyboard.press("ArrowRight")
    assert page.evaluate("document.activeElement.dataset.row") == "2"
    assert strip_weights(page) == pytest.approx(cross["weights"][0][0][2], abs=1e-5)
    page.keyboard.press("End")
    assert page.evaluate("document.activeElement.dataset.row") == str(len(cross["rows"]) - 1)

    page.select_option("#kind", value="encoder")  # rows become the source tokens
    assert tokens.all_inner_texts() == maps["attention"]["encoder"]["rows"]
    assert page.locator("#layer option").count() == layers
    page.select_option("#kind", value="cross")
    page.select_option("#layer", label=str(layers))
    page.locator("#entropy .head-pick", has_text="mean").click()
    tokens.nth(1).click()
    assert strip_weights(page) == pytest.approx(mean, abs=1e-5)  # back where it began
    page.screenshot(path=str(shots_dir(tmp_path) / "serve.png"), full_page=True)
    assert errors == []
    page.close()


def test_the_page_fits_a_phone_and_reports_bad_input(browser, server, texts, tmp_path):
    page, errors = open_page(browser, server, SIZES["phone"])
    translate(page, texts[:1])
    page.locator("#tokens .token").nth(1).click()
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= SIZES["phone"][0], "the page scrolls sideways at phone width"
    page.screenshot(path=str(shots_dir(tmp_path) / "serve_phone.png"), full_page=True)
    page.fill("#nbest", "9")
    page.press("#texts", "Control+Enter")
    status = page.locator("#status.error")
    status.wait_for()
    assert status.inner_text() == "nbest: 9 needs beam >= 9"
    assert errors == [
        m for m in errors if "422" in m
    ]  # the answer's own console line, nothing else
    page.close()


def test_the_api_page_renders_offline(browser, server):
    page = browser.new_page()
    outside: list[str] = []
    page.on("request", lambda r: None if r.url.startswith(server) else outside.append(r.url))
    page.goto(f"{server}docs")
    page.get_by_text("/translate", exact=True).first.wait_for()
    assert outside == []
    page.close()
