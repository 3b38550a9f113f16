"""`tformer serve`, `export`, `import` and `tokenizer train`."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from tformer_cli.cli.app import (
    Command,
    app,
    check_engine,
    err,
    friendly_errors,
    out,
    positional,
    tokenizer_app,
    wrote,
)
from tformer_cli.cli.options import command, one_of, shared
from tformer_cli.config import MAX_VOCAB, TOKENIZERS, ServeOptions, TrainConfig

# CTranslate2's weight types (interop.ct2.QUANTIZATIONS, which imports ctranslate2)
QUANTIZATIONS = ("float32", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16",
                 "float16", "bfloat16")  # fmt: skip


# ---------------------------------------------------------------------------- serve
@dataclass(frozen=True)
class Serve(ServeOptions):
    """``tformer serve``: the server (``ServeOptions``), the run it serves and where."""

    model: Path | None = shared("model")
    device: str = shared("device")
    precision: str | None = shared("precision")
    engine: str = shared("engine")
    threads: int = shared("threads")
    quiet: bool = shared("quiet")


@command(Serve, "serve")
def serve_command(v: Serve) -> None:
    """Serve translations and attention maps over HTTP, with a page to explore them at /.

    POST /translate answers with the objects of translate --json, POST /attention with those of
    inspect-attention --json; GET /health, GET /model; the API's own page is /docs. Requests
    that arrive together are decoded in one batch. Needs the serve extra.
    """
    from tformer_cli.api.decoding import interop_packages
    from tformer_cli.serve import serve

    check_engine(v.engine, None)
    with interop_packages() if v.engine == "ctranslate2" else contextlib.nullcontext():
        serve(
            v.model, err, v, device=v.device, precision=v.precision, engine=v.engine,
            threads=v.threads, quiet=v.quiet,
        )  # fmt: skip


# ---------------------------------------------------------------------------- export, import
@app.command("export", cls=Command)
@friendly_errors
def export_command(
    to: Annotated[
        str,
        typer.Option(
            "--to",
            parser=one_of("ctranslate2", "hf"),
            help="ctranslate2, or hf (a MarianMTModel for transformers).",
        ),
    ],
    legacy: Annotated[
        list[Path] | None,
        typer.Argument(help="Deprecated: use -m RUN -o DIR.", hidden=True, metavar="RUN"),
    ] = None,
    model: Annotated[
        Path | None,
        typer.Option("--model", "-m", help="Run folder. Default: the newest run under runs/."),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Folder to write (new, or empty).", show_default=False),
    ] = None,
    quantization: Annotated[
        str,
        typer.Option(
            parser=one_of(*QUANTIZATIONS),
            help="CTranslate2 weights: float32, int8, int8_float32, int8_float16, int8_bfloat16,"
            " int16, float16 or bfloat16.",
        ),
    ] = "float32",
) -> None:
    """Export a run for deployment or sharing, its tokenizer with it.

    ctranslate2: any run, for CTranslate2's fast decoding (exact: the same weights and position
    table). hf: a run trained post-LN with sinusoidal positions (the toy recipe's), as a
    Hugging Face MarianMTModel folder with a fast tokenizer and a generation config.
    """
    from tformer_cli.api.reports import export_run

    if to not in ("ctranslate2", "hf"):
        raise typer.BadParameter(f"{to!r}: use ctranslate2 or hf", param_hint="--to")
    if to == "hf" and quantization != "float32":
        raise typer.BadParameter("quantizes CTranslate2 weights only", param_hint="--quantization")
    if legacy:
        if len(legacy) != 2:
            raise typer.BadParameter("give -m RUN -o DIR", param_hint="RUN OUTPUT")
        old, new = "tformer export RUN DIR", "tformer export -m RUN -o DIR"
        model, output = positional(legacy[0], model, old, new), legacy[1]
    if output is None:
        raise typer.BadParameter("the folder to write: -o DIR", param_hint="--output")
    run_dir, written = export_run(model, to, output, quantization)
    out.print(f"exported {run_dir} ({to})", markup=False)
    wrote(written)


@app.command("import", cls=Command)
@friendly_errors
def import_command(
    source: Annotated[
        str, typer.Argument(help="hf:NAME (a model on the Hugging Face Hub) or a model folder.")
    ],
    name: Annotated[
        str | None, typer.Option(help="Run name. Default: the model's (its last path part).")
    ] = None,
    runs_dir: Annotated[Path, typer.Option(help="Folder holding the runs.")] = Path("runs"),
) -> None:
    """Import a Hugging Face Marian model (e.g. hf:Helsinki-NLP/opus-mt-de-en) as a run.

    translate, eval (give --data: an import has no data of its own), inspect-attention, serve
    and train --init-from use it as a trained run; tformer runs lists it as imported. Offline
    (HF_HUB_OFFLINE=1), hf:NAME reads the Hugging Face cache. A folder made by export --to hf
    comes back as the run it was: its weights, tokenizer, beam_alpha and precision.
    """
    from tformer_cli.api.reports import import_run

    run_dir = import_run(source, runs_dir, name)
    out.print(f"imported {source} -> {run_dir}", markup=False)


# ---------------------------------------------------------------------------- tokenizer
@tokenizer_app.command("train", cls=Command)
@friendly_errors
def tokenizer_train(
    legacy: Annotated[
        Path | None, typer.Argument(help="Deprecated: use -o FILE.", hidden=True, metavar="FILE")
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Where to write tokenizer.json.", show_default=False),
    ] = None,
    data: Annotated[str, typer.Option(help="Corpus: toy, a folder or file, or hf:NAME.")] = "toy",
    src: Annotated[str | None, typer.Option(help="Source language suffix of plain files.")] = None,
    tgt: Annotated[str | None, typer.Option(help="Target language suffix of plain files.")] = None,
    vocab_size: Annotated[
        int, typer.Option(min=1, max=MAX_VOCAB, help="Vocabulary size.")
    ] = TrainConfig.vocab_size,
    tokenizer: Annotated[
        str,
        typer.Option(
            parser=one_of(*TOKENIZERS), help="bpe, unigram or wordlevel. (Formerly --kind.)"
        ),
    ] = "bpe",
) -> None:
    """Train a shared source+target tokenizer as tformer train would, and print its statistics
    on the validation split: tokens per sentence and unknown rate, to compare --vocab-size and
    --tokenizer choices before training a model."""
    from tformer_cli.api.reports import train_tokenizer

    output = positional(
        legacy, output, "tformer tokenizer train FILE", "tformer tokenizer train -o FILE"
    )
    if output is None:
        raise typer.BadParameter("where to write tokenizer.json: -o FILE", param_hint="--output")
    vocabulary, stats = train_tokenizer(
        output, data=data, src=src, tgt=tgt, vocab_size=vocab_size, kind=tokenizer
    )
    for side in stats:
        out.print(
            f"valid {side.side}: {side.sentences} sentences, {side.avg_tokens:.1f}"
            f" tokens/sentence, unknown rate {side.unk_rate:.2%}"
        )
    out.print(f"vocabulary: {vocabulary} types", markup=False)
    wrote(output)
