"""`tformer serve`, `export`, `import` and `tokenizer train`."""

from __future__ import annotations

import contextlib
from dataclasses import MISSING, dataclass
from pathlib import Path

import typer

from tformer_cli.cli.app import err, out, positional, tokenizer_app, wrote
from tformer_cli.cli.options import command, legacy_run, shared
from tformer_cli.config import QUANTIZATIONS, OneOf, ServeOptions, TrainConfig, setting
from tformer_cli.config.fields import same_as
from tformer_cli.engines import interop_packages


# ---------------------------------------------------------------------------- serve
@dataclass(frozen=True)
class Serve(ServeOptions):
    """``tformer serve``: the server (``ServeOptions``), the run it serves and where."""

    model: Path | None = shared("model")
    device: str = shared("device")
    precision: str | None = shared("precision")
    compile: str = shared("compile")
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
    from tformer_cli.serve import serve

    with interop_packages() if v.engine == "ctranslate2" else contextlib.nullcontext():
        serve(
            v.model, err, v, device=v.device, precision=v.precision, compile=v.compile,
            engine=v.engine, threads=v.threads, quiet=v.quiet,
        )  # fmt: skip


# ---------------------------------------------------------------------------- export, import
@dataclass(frozen=True, kw_only=True)
class Export:
    """``tformer export``: the run, the format and the folder written."""

    to: str = setting(
        MISSING,
        "ctranslate2, or hf (a MarianMTModel for transformers).",
        flags=("--to",),
        values=OneOf(("ctranslate2", "hf")),
    )
    legacy: list[Path] | None = legacy_run("Deprecated: use -m RUN -o DIR.")
    model: Path | None = shared("model")
    output: Path | None = setting(
        None, "Folder to write (new, or empty).", flags=("--output", "-o"), metavar="DIR"
    )
    quantization: str = setting(
        "float32",
        "CTranslate2 weights: float32, int8, int8_float32, int8_float16, int8_bfloat16,"
        " int16, float16 or bfloat16.",
        values=OneOf(QUANTIZATIONS),
        metavar="TYPE",
    )


@command(Export, "export")
def export_command(v: Export) -> None:
    """Export a run for deployment or sharing, its tokenizer with it.

    ctranslate2: any run, for CTranslate2's fast decoding (exact: the same weights and position
    table). hf: a run trained post-LN with sinusoidal positions (the toy recipe's), as a
    Hugging Face MarianMTModel folder with a fast tokenizer and a generation config.
    """
    from tformer_cli.report.pick import choose_run

    if v.to == "hf" and v.quantization != "float32":
        raise typer.BadParameter("quantizes CTranslate2 weights only", param_hint="--quantization")
    model, output = v.model, v.output
    if v.legacy:
        if len(v.legacy) != 2:
            raise typer.BadParameter("give -m RUN -o DIR", param_hint="RUN OUTPUT")
        old, new = "tformer export RUN DIR", "tformer export -m RUN -o DIR"
        model, output = positional(v.legacy[0], model, old, new), v.legacy[1]
    if output is None:
        raise typer.BadParameter("the folder to write: -o DIR", param_hint="--output")
    run_dir = choose_run(model)
    with interop_packages():
        if v.to == "ctranslate2":
            from tformer_cli.interop.ct2 import export_ctranslate2

            written = export_ctranslate2(run_dir, output, v.quantization)
        else:
            from tformer_cli.interop.hf import export_hf

            written = export_hf(run_dir, output)
    out.print(f"exported {run_dir} ({v.to})", markup=False)
    wrote(written)


@dataclass(frozen=True, kw_only=True)
class Import:
    """``tformer import``: the model, and the run it becomes."""

    source: str = setting(
        MISSING, "hf:NAME (a model on the Hugging Face Hub) or a model folder.", argument=True
    )
    name: str | None = setting(None, "Run name. Default: the model's (its last path part).")
    runs_dir: Path = setting(Path("runs"), "Folder holding the runs.", metavar="DIR")


@command(Import, "import")
def import_command(v: Import) -> None:
    """Import a Hugging Face Marian model (e.g. hf:Helsinki-NLP/opus-mt-de-en) as a run.

    translate, eval (give --data: an import has no data of its own), inspect-attention, serve
    and train --init-from use it as a trained run; tformer runs lists it as imported. Offline
    (HF_HUB_OFFLINE=1), hf:NAME reads the Hugging Face cache. A folder made by export --to hf
    comes back as the run it was: its weights, tokenizer, beam_alpha and precision.
    """

    with interop_packages():
        from tformer_cli.interop.hf import import_marian

        run_dir = import_marian(v.source, v.runs_dir, v.name)
    out.print(f"imported {v.source} -> {run_dir}", markup=False)


# ---------------------------------------------------------------------------- tokenizer
@dataclass(frozen=True)
class TokenizerTrain:
    """``tformer tokenizer train``: the corpus, the tokenizer and where it goes."""

    legacy: Path | None = legacy_run("Deprecated: use -o FILE.", "FILE")
    output: Path | None = setting(None, "Where to write tokenizer.json.", flags=("--output", "-o"))
    data: str = setting("toy", "Corpus: toy, a folder or file, or hf:NAME.")
    src: str | None = same_as(TrainConfig, "src_lang")
    tgt: str | None = same_as(TrainConfig, "tgt_lang")
    vocab_size: int = same_as(TrainConfig, "vocab_size", "Vocabulary size.")
    tokenizer: str = same_as(
        TrainConfig, "tokenizer_kind", "bpe, unigram or wordlevel. (Formerly --kind.)"
    )


@command(TokenizerTrain, "train", group=tokenizer_app)
def tokenizer_train(v: TokenizerTrain) -> None:
    """Train a shared source+target tokenizer as tformer train would, and print its statistics
    on the validation split: tokens per sentence and unknown rate, to compare --vocab-size and
    --tokenizer choices before training a model."""
    from tformer_cli.data.corpus import corpus_within, training_text
    from tformer_cli.data.tokenizer import save_tokenizer, tokenizer_stats, train_tokenizer

    old, new = "tformer tokenizer train FILE", "tformer tokenizer train -o FILE"
    output = positional(v.legacy, v.output, old, new)
    if output is None:
        raise typer.BadParameter("where to write tokenizer.json: -o FILE", param_hint="--output")
    with corpus_within(v.data, src_lang=v.src, tgt_lang=v.tgt) as corpus:
        sample = training_text(corpus["train"], TrainConfig().tokenizer_sample)
        tok = train_tokenizer(sample, v.vocab_size, v.tokenizer)
        valid = {side: tokenizer_stats(tok, corpus["valid"][side]) for side in ("src", "tgt")}
    save_tokenizer(tok, output)
    for side, stats in valid.items():
        out.print(
            f"valid {side}: {stats.sentences} sentences, {stats.avg_tokens:.1f}"
            f" tokens/sentence, unknown rate {stats.unk_rate:.2%}"
        )
    out.print(f"vocabulary: {tok.get_vocab_size()} types", markup=False)
    wrote(output)
