"""What ``tformer translate``, ``inspect-attention`` and ``serve`` do with a run: the engines,
the texts to read, translation streamed in the command's output formats, the step-through trace
and the attention report. Light to import: each function loads what it needs when called."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, TextIO

from rich.console import Console

from tformer_cli.config import AttentionOptions, DecodeConfig
from tformer_cli.errors import TformerError

if TYPE_CHECKING:
    from tformer_cli.checkpoint import LoadedRun
    from tformer_cli.decode.translate import SourcesEngine


@contextlib.contextmanager
def interop_packages() -> Iterator[None]:
    """A missing package of the interop routes as a one-line error naming what to install."""
    try:
        yield
    except ModuleNotFoundError as e:
        raise TformerError(
            f"{e.name} is not installed: pip install ctranslate2 transformers sentencepiece"
            " protobuf (or tformer's dev extra)"
        ) from None


def engine_refusal(
    engine: str, cfg: DecodeConfig | None, runs: int = 1, cache: bool = True
) -> str | None:
    """Why ``engine`` cannot decode: an unknown name, or a search ``cfg`` of ``runs`` runs that
    CTranslate2 cannot do (``cache``: with the KV cache); ``None`` where it can."""
    from tformer_cli.decode.translate import ENGINES

    if engine not in ENGINES:
        return f"{engine!r}: use torch or ctranslate2"
    if engine == "ctranslate2" and cfg is not None:
        with interop_packages():
            from tformer_cli.interop.engine import refusal

        return refusal(cfg, runs, cache)
    return None


def load_engine(engine: str, run: LoadedRun) -> SourcesEngine | None:
    """The run's CTranslate2 engine (its export made on first use) for ``ctranslate2``;
    ``None`` (tformer's search) for torch."""
    if engine == "torch":
        return None
    with interop_packages():
        from tformer_cli.interop.engine import ctranslate2_engine

        return ctranslate2_engine(run)


def read_inputs(
    texts: list[str] | None, file: Path | None, stdin: TextIO
) -> tuple[Iterable[str], int | None] | None:
    """The texts to translate and their count if known: the arguments, the lines of a file
    (``-``: stdin) or of piped ``stdin``, read as they come; ``None``: ask on the terminal."""
    from tformer_cli.decode.streams import check_arguments, count_lines, file_lines, read_lines

    if texts and file is not None:
        raise TformerError("give sentences or --file, not both")
    if texts:
        return check_arguments(texts), len(texts)
    if file is not None and str(file) != "-":
        return file_lines(file), count_lines(file)
    if file is None and stdin.isatty():
        return None
    return read_lines(stdin.buffer, "stdin"), None


def output_style(json_out: bool, nbest: int, scores: bool) -> str:
    """The format of translate's lines: json, nbest (INDEX, SCORE, TEXT), scores or plain."""
    return "json" if json_out else "nbest" if nbest > 1 else "scores" if scores else "plain"


@dataclass(frozen=True)
class Translator:
    """Loaded runs (an ensemble past one) with the search of a ``tformer translate`` and what
    decodes (``engine``: ``None`` for tformer's search; ``use_cache``: its KV cache)."""

    runs: list[LoadedRun]
    cfg: DecodeConfig
    engine: SourcesEngine | None = None
    use_cache: bool = True

    def with_engine(self, engine: str) -> Translator:
        """This translator decoding with ``engine``: torch, or ctranslate2 (the run's export,
        made on first use)."""
        return dataclasses.replace(self, engine=load_engine(engine, self.runs[0]))

    def trace(self, path: Path, texts: Sequence[str]) -> None:
        """``--trace``: the step-through search (``Run.trace``) of the first text, as JSON."""
        from tformer_cli.api.run import Run
        from tformer_cli.files import atomic_write_text

        cfg = self.cfg
        if not texts or cfg.sampling is not None or cfg.mbr:
            raise TformerError("--trace follows the search of a sentence given as an argument")
        traced = Run(self.runs, cfg.alpha).trace(texts[0], beam=cfg.beam, top=cfg.beam + 5)
        atomic_write_text(path, traced.to_json() + "\n")

    def line(self, text: str, style: str) -> str:
        """The output line of one text (the terminal prompt's)."""
        from tformer_cli.decode.streams import format_translations
        from tformer_cli.decode.translate import Batching, translate_texts

        batching = Batching(use_cache=self.use_cache)
        result = translate_texts(self.runs, [text], self.cfg, batching, engine=self.engine)
        return format_translations(result, style)[0]

    def stream(
        self, lines: Iterable[str], total: int | None, log: Console, *, style: str,
        output: Path | None, sink: BinaryIO, max_tokens: int, batch_size: int | None,
        chunk_size: int, quiet: bool,
    ) -> int:  # fmt: skip
        """Translate ``lines`` ``chunk_size`` at a time, each chunk sorted by length into
        batches, and write each chunk's lines as soon as they are ready: to ``sink``, or to
        ``output`` whole at the end; a progress bar on ``log`` past 100 lines. The count."""
        from tformer_cli.console import make_progress
        from tformer_cli.decode import streams
        from tformer_cli.decode.translate import Batching
        from tformer_cli.device import oom_hint

        few = total < 100 if total is not None else not log.is_terminal  # no bar: a short job
        with (
            make_progress("translate", log, disable=quiet or few) as progress,
            oom_hint(max_tokens),
        ):
            task = progress.add_task("translate", total=total, info="")
            chunks = streams.translate_chunks(
                self.runs, lines, self.cfg, Batching(max_tokens, batch_size, self.use_cache),
                chunk_size=chunk_size, on_batch=lambda n: progress.advance(task, n),
                engine=self.engine,
            )  # fmt: skip
            if output is not None:
                return streams.save_translations(output, chunks, style)
            return streams.write_translations(chunks, sink, style)


def open_translator(
    models: Sequence[Path] | None, cfg: DecodeConfig, *, alpha: float | None, device: str,
    precision: str | None, compile: str, use_cache: bool, threads: int = 0,
) -> Translator:  # fmt: skip
    """The runs loaded for ``tformer translate`` (default: the newest) with ``precision``
    (default: the first run's own), the search ``cfg`` with ``alpha`` (default: the first run's
    ``beam_alpha``), on ``threads`` CPU threads as ``tformer eval`` (``use_threads``);
    tformer's search decodes until ``with_engine`` says otherwise."""
    from tformer_cli.api.run import own_precision, run_alpha
    from tformer_cli.checkpoint import load_runs
    from tformer_cli.report.eval_run import use_threads
    from tformer_cli.report.pick import choose_run

    paths = [choose_run(m) for m in models or [None]]
    precision = precision or own_precision(paths[0])
    runs = load_runs(paths, device, precision, compile)
    use_threads(threads)
    if alpha is None:  # the first run's
        cfg = dataclasses.replace(cfg, alpha=run_alpha(None, runs[0].config))
    return Translator(runs, cfg, use_cache=use_cache)


def inspect_attention(
    text: str, model: Path | None, console: Console, log: Console, *, options: AttentionOptions,
    device: str, precision: str | None, save: Path | None = None, json_path: Path | None = None,
) -> None:  # fmt: skip
    """``tformer inspect-attention``: translate ``text`` with the run (default: the newest) in
    ``precision`` (default: its own), print the maps ``options`` asks for and the per-head
    table on ``console``; ``save``: a picture, ``json_path``: every weight as JSON."""
    from tformer_cli.api.run import own_precision
    from tformer_cli.report.attention.view import AttentionRequest
    from tformer_cli.report.attention.view import inspect_attention as inspect

    asked = {f.name: getattr(options, f.name) for f in dataclasses.fields(AttentionOptions)}
    request = AttentionRequest(**asked, device=device, precision=precision or own_precision(model))
    inspect(text, model, request, console, log, save=save, json_path=json_path)


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (a temporary file renamed)."""
    from tformer_cli.files import atomic_write_text

    atomic_write_text(path, text)
