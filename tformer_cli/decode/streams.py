"""Text streams for ``tformer translate``: UTF-8 lines in (arguments, files, stdin), translated
chunk by chunk, and lines out in the output formats."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from tformer_cli.checkpoint import LoadedRun
from tformer_cli.config import DecodeConfig
from tformer_cli.decode.search import DEFAULT
from tformer_cli.decode.translate import (
    BATCHING,
    Batching,
    SourcesEngine,
    TextTranslation,
    translate_texts,
)
from tformer_cli.errors import TformerError
from tformer_cli.files import atomic_write

_BOM = b"\xef\xbb\xbf"


def read_lines(stream: BinaryIO, name: str) -> Iterator[str]:
    r"""The lines of a UTF-8 byte stream, each as soon as it arrives: what ends in ``\n`` (other
    Unicode separators stay inside), less a trailing ``\r`` and a leading byte order mark.
    Invalid UTF-8 is an error naming ``name`` and the line."""
    for number, raw in enumerate(stream, start=1):
        if number == 1 and not (raw := raw.removeprefix(_BOM)):
            return
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TformerError(
                f"{name} line {number} is not valid UTF-8 ({e.reason} at byte {e.start + 1})"
            ) from None
        yield line.removesuffix("\n").removesuffix("\r")


def check_arguments(texts: list[str]) -> list[str]:
    """``texts`` from the command line, if none holds bytes that are not UTF-8 (lone
    surrogates, which no tokenizer can take)."""
    for number, text in enumerate(texts, start=1):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise TformerError(
                f"argument {number} is not valid UTF-8 (bad byte at character {e.start + 1})"
            ) from None
    return texts


def count_lines(path: Path) -> int:
    """How many lines ``read_lines`` finds in a file (read in blocks: no text kept)."""
    count, last = 0, b"\n"
    try:
        with path.open("rb") as f:
            head = f.read(len(_BOM)).removeprefix(_BOM)
            for block in itertools.chain([head], iter(lambda: f.read(1 << 20), b"")):
                if block:
                    count, last = count + block.count(b"\n"), block[-1:]
    except OSError as e:
        raise TformerError(f"cannot read {path}: {e.strerror or e}") from None
    return count + (last != b"\n")


def file_lines(path: Path) -> Iterator[str]:
    """``read_lines`` of a file, opened on the first line asked for and closed after the last."""
    with path.open("rb") as stream:
        yield from read_lines(stream, str(path))


def translate_chunks(
    run: LoadedRun | Sequence[LoadedRun],
    lines: Iterable[str],
    cfg: DecodeConfig = DEFAULT,
    batching: Batching = BATCHING,
    *,
    chunk_size: int = 2000,
    on_batch: Callable[[int], None] | None = None,
    engine: SourcesEngine | None = None,
) -> Iterator[list[TextTranslation]]:
    """``translate_texts`` of ``chunk_size`` lines at a time, in input order: the first chunk
    is ready before the input ends, and memory holds one chunk."""
    lines = iter(lines)
    first = 1
    while chunk := list(itertools.islice(lines, chunk_size)):
        yield translate_texts(
            run, chunk, cfg, batching, on_batch=on_batch, first=first, engine=engine
        )
        first += len(chunk)


def one_line(text: str) -> str:
    """``text`` with its line breaks made spaces: an output line per input, whatever the
    tokenizer decodes."""
    return text.replace("\r\n", " ").replace("\r", " ").replace("\n", " ")


def format_translations(
    results: Sequence[TextTranslation], style: str, start: int = 0
) -> list[str]:
    """One line per input (``plain``, ``scores``, ``json``) or per hypothesis (``nbest``);
    ``start``: the index of the first result (``json`` and ``nbest`` lines carry it)."""
    lines = []
    for i, r in enumerate(results, start=start):
        pairs = list(zip(r.translations, r.hypotheses, strict=True))
        if style == "json":
            hyps = [
                {"translation": t, "score": h.score, "logprob": h.logprob, "finished": h.finished}
                for t, h in pairs
            ]
            record = {"index": i, "source": r.source, "hypotheses": hyps, "ms": 1000 * r.seconds}
            lines.append(json.dumps(record, ensure_ascii=False))
        elif style == "nbest":
            lines += [f"{i}\t{h.score:.4f}\t{one_line(t)}" for t, h in pairs]
        elif style == "scores":
            lines.append(f"{pairs[0][1].score:.4f}\t{one_line(pairs[0][0])}")
        else:
            lines.append(one_line(pairs[0][0]))
    return lines


def write_translations(
    chunks: Iterable[Sequence[TextTranslation]], out: BinaryIO, style: str
) -> int:
    """Write and flush each chunk's lines as UTF-8; the number of inputs translated. A failed
    write is one line naming ``out``; a reader that left is for the caller."""
    count = 0
    try:
        for results in chunks:
            lines = format_translations(results, style, start=count)
            out.write("".join(f"{line}\n" for line in lines).encode("utf-8"))
            out.flush()
            count += len(results)
    except BrokenPipeError:
        raise
    except OSError as e:
        name = getattr(out, "name", None)
        where = "to standard output" if name in ("<stdout>", 1) else f"{name}"
        raise TformerError(f"cannot write {where}: {e.strerror or e}") from e
    return count


def save_translations(path: Path, chunks: Iterable[Sequence[TextTranslation]], style: str) -> int:
    """``write_translations`` into ``path``, whole or not at all."""
    count = 0

    def write(tmp: Path) -> None:
        nonlocal count
        with tmp.open("wb") as out:
            count = write_translations(chunks, out, style)

    atomic_write(path, write, durable=False)  # an output, not run state: no fsync
    return count
