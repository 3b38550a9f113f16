"""Tests for tformer_cli.decode.streams: the translation of text streams in chunks (line
splitting, UTF-8 errors, one output line per line) and the output formats."""

from __future__ import annotations

import io
import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tformer_cli.checkpoint import LoadedRun, load_run
from tformer_cli.config import DecodeConfig
from tformer_cli.decode.reference import Hypothesis
from tformer_cli.decode.streams import (
    check_arguments,
    count_lines,
    format_translations,
    read_lines,
    translate_chunks,
    write_translations,
)
from tformer_cli.decode.translate import TextTranslation, translate_texts
from tformer_cli.errors import TformerError


@pytest.fixture
def run(tmp_path, make_run, monkeypatch) -> LoadedRun:
    """A tiny untrained run (word-level vocabulary of ``WORDS``), loaded on one CPU thread."""
    monkeypatch.setenv("TFORMER_THREADS", "1")
    run_dir, _ = make_run(tmp_path / "run")
    return load_run(run_dir, "cpu")


GREEDY = DecodeConfig(max_len_a=0.0, max_len_b=2)


def lines_of(data: bytes, name: str = "in") -> list[str]:
    return list(read_lines(io.BytesIO(data), name))


def test_read_lines_splits_on_newline_only_and_drops_crlf_and_a_leading_bom():
    data = "\ufeffa\u2028b\x85c\r\n\x0cd\x1c\r\ne\rf\n\ufeffg".encode()
    assert lines_of(data) == ["a\u2028b\x85c", "\x0cd\x1c", "e\rf", "\ufeffg"]
    assert lines_of(b"") == [] and lines_of(b"\n") == [""] and lines_of(b"x\n\n") == ["x", ""]
    assert lines_of(b"\xef\xbb\xbf") == [] and lines_of(b"\xef\xbb\xbf\n") == [""]


def test_read_lines_names_the_line_that_is_not_utf8():
    lines = read_lines(io.BytesIO(b"fine\nder hund\xff sieht\nnever read\n"), "stdin")
    assert next(lines) == "fine"
    message = "stdin line 2 is not valid UTF-8 (invalid start byte at byte 9)"
    with pytest.raises(TformerError, match=f"^{re.escape(message)}$"):
        next(lines)


@pytest.mark.parametrize(
    "data",
    [b"", b"a", b"a\n", b"a\r\n\nb", b"\n\n", b"\xef\xbb\xbf", b"\xef\xbb\xbf\n", b"\xef\xbb\xbfa"],
)
def test_count_lines_agrees_with_read_lines(tmp_path, data):
    path = tmp_path / "in.txt"
    path.write_bytes(data)
    assert count_lines(path) == len(lines_of(data))


def test_command_line_arguments_with_undecodable_bytes_are_an_error():
    assert check_arguments(["der hund", "\u2028"]) == ["der hund", "\u2028"]
    with pytest.raises(TformerError, match="argument 2 is not valid UTF-8"):
        check_arguments(["der hund", "die katze\udcff"])  # how Python keeps the byte 0xff


def test_a_translation_holding_line_breaks_is_written_on_one_line():
    """A run's tokenizer.json may be any Hugging Face tokenizer; a byte-level one decodes
    newlines. Plain, scores and n-best output keep one line per input (JSON escapes them)."""
    hyp = Hypothesis([4], -1.0, -1.0)
    results = [TextTranslation("x", ["a\nb\r\nc\rd\u2028e"], [hyp], 0.0)]
    for style in ("plain", "scores", "nbest", "json"):
        (line,) = format_translations(results, style)
        assert "\n" not in line and "\r" not in line
    assert format_translations(results, "plain") == ["a b c d\u2028e"]


@pytest.mark.parametrize("chunk_size", [1, 2, 100])
def test_translate_chunks_equals_translating_everything_at_once(run, chunk_size):
    texts = ["red cat", "one two three four", "", "big dog", "small bird red"]
    chunks = list(translate_chunks(run, iter(texts), GREEDY, chunk_size=chunk_size))
    assert [len(c) for c in chunks] == [min(chunk_size, 5 - i) for i in range(0, 5, chunk_size)]
    whole = translate_texts(run, texts, GREEDY)
    got = [r for chunk in chunks for r in chunk]
    assert [r.source for r in got] == texts
    assert [r.translations for r in got] == [r.translations for r in whole]


def test_translate_chunks_reads_no_further_than_the_chunk_it_translates(run):
    read: list[str] = []

    def lines():
        for text in ["red cat", "blue dog", "one", "two", "three"]:
            read.append(text)
            yield text

    chunks = translate_chunks(run, lines(), GREEDY, chunk_size=2)
    assert len(next(chunks)) == 2 and read == ["red cat", "blue dog"]
    assert len(next(chunks)) == 2 and len(read) == 4


def test_write_translations_flushes_each_chunk_and_numbers_inputs_globally(run):
    flushed: list[bytes] = []

    class Recorder(io.BytesIO):
        def flush(self) -> None:
            flushed.append(self.getvalue())

    out = Recorder()
    chunks = translate_chunks(run, ["red", "cat", "dog"], GREEDY, chunk_size=2)
    assert write_translations(chunks, out, "json") == 3
    assert [v.count(b"\n") for v in flushed] == [2, 3]
    assert [json.loads(line)["index"] for line in out.getvalue().splitlines()] == [0, 1, 2]


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    lines=st.lists(
        st.one_of(
            st.text(max_size=30),
            st.sampled_from(["red cat", " big  dog\t", "\u2028", "\x85", "\r", "\x0c", "\ufeff"]),
        ),
        max_size=6,
    ),
    end=st.sampled_from(["", "\n", "\r\n"]),
    chunk_size=st.integers(1, 4),
)
def test_any_text_gives_one_output_line_per_input_line_or_a_one_line_error(
    run, lines, end, chunk_size
):
    """What ``tformer translate`` does with stdin, in-process: any valid UTF-8 text, control
    characters and Unicode separators included, translates to exactly one line per
    ``\\n``-terminated input line, or stops with a one-line ``TformerError`` (which the CLI
    prints as ``Error: ...``); no other exception."""
    data = ("\n".join(lines) + end if lines else "").encode("utf-8")
    text = data.removeprefix(b"\xef\xbb\xbf")  # a leading byte order mark is no text
    expected = text.count(b"\n") + (not text.endswith(b"\n") if text else 0)
    out = io.BytesIO()
    cfg = DecodeConfig(max_len_a=0.0, max_len_b=1)
    try:
        count = write_translations(
            translate_chunks(
                run, read_lines(io.BytesIO(data), "stdin"), cfg, chunk_size=chunk_size
            ),
            out,
            "plain",
        )
    except TformerError as e:
        assert "\n" not in str(e)
        return
    assert count == expected
    assert out.getvalue().count(b"\n") == expected
    assert out.getvalue().endswith(b"\n") or not expected
