"""The `tformer` command line: options, help text and error messages. The work happens elsewhere."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console

from tformer_cli import __version__
from tformer_cli.console import make_progress
from tformer_cli.errors import TformerError

if TYPE_CHECKING:
    from tformer_cli.decoding import TextTranslation

F = TypeVar("F", bound=Callable[..., Any])

app = typer.Typer(
    name="tformer",
    help="Train, run and study a from-scratch Transformer for machine translation.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)
tokenizer_app = typer.Typer(help="Train and inspect subword tokenizers.", no_args_is_help=True)
app.add_typer(tokenizer_app, name="tokenizer")

err = Console(stderr=True, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)


def friendly_errors(fn: F) -> F:
    """Print a ``TformerError`` as one line on stderr, exit 1 (traceback with TFORMER_DEBUG=1)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TformerError as e:
            if os.environ.get("TFORMER_DEBUG"):
                raise
            err.print(f"[bold red]Error:[/] {e}", markup=True, highlight=False)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            err.print("interrupted")
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def version_callback(value: bool) -> None:
    if value:
        out.print(f"tformer {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=version_callback, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """Train, run and study a from-scratch Transformer for machine translation."""


# ---------------------------------------------------------------------------- shared options
ModelDir = Annotated[
    Path | None,
    typer.Option(
        "--model", "-m", help="Run folder. Default: the newest run under runs/.", show_default=False
    ),
]
Device = Annotated[str, typer.Option(help="auto (CUDA > MPS > CPU), cpu, cuda or mps.")]
Precision = Annotated[
    str, typer.Option(help="fp32, bf16 (autocast) or auto (bf16 where the hardware is fast at it).")
]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or log lines.")]


# ---------------------------------------------------------------------------- train
@app.command()
@friendly_errors
def train(
    data: Annotated[
        str,
        typer.Option(
            help="toy (bundled), a folder or .tsv/.jsonl file, or hf:NAME[:CONFIG] (Hugging Face)."
        ),
    ] = "toy",
    src: Annotated[str | None, typer.Option(help="Source language suffix of plain files.")] = None,
    tgt: Annotated[str | None, typer.Option(help="Target language suffix of plain files.")] = None,
    name: Annotated[
        str | None, typer.Option(help="Run name: runs/NAME. Default: data + time.")
    ] = None,
    runs_dir: Annotated[Path, typer.Option(help="Folder holding the runs.")] = Path("runs"),
    resume: Annotated[
        Path | None, typer.Option(help="Continue the run in this folder from its last.pt.")
    ] = None,
    vocab_size: Annotated[int, typer.Option(help="Shared BPE vocabulary size.")] = 8000,
    tokenizer: Annotated[str, typer.Option(help="bpe, unigram or wordlevel.")] = "bpe",
    d_model: Annotated[int, typer.Option(help="Model width d_model.")] = 256,
    heads: Annotated[int, typer.Option(help="Attention heads h.")] = 4,
    d_ff: Annotated[int, typer.Option(help="Inner width of the feed-forward layers.")] = 1024,
    layers: Annotated[int, typer.Option(help="Encoder and decoder layers (each).")] = 3,
    dropout: Annotated[
        float, typer.Option(help="Dropout on embeddings and sublayer outputs.")
    ] = 0.1,
    positional: Annotated[
        str, typer.Option(help="sinusoidal or learned positions.")
    ] = "sinusoidal",
    norm: Annotated[
        str, typer.Option(help="post (LayerNorm(x + f(x)), the paper's) or pre.")
    ] = "post",
    tie: Annotated[bool, typer.Option(help="Tie embeddings and output layer.")] = True,
    max_tokens: Annotated[int, typer.Option(help="Batch size in padded tokens.")] = 4096,
    max_len: Annotated[
        int, typer.Option(help="Skip training pairs longer than this (tokens).")
    ] = 256,
    lr: Annotated[float, typer.Option(help="Peak learning rate (AdamW).")] = 7e-4,
    warmup: Annotated[
        int, typer.Option(help="Linear warm-up steps, then 1/sqrt(step) decay.")
    ] = 500,
    label_smoothing: Annotated[float, typer.Option(help="Label smoothing epsilon.")] = 0.1,
    clip_norm: Annotated[float, typer.Option(help="Gradient norm clipping.")] = 1.0,
    accum: Annotated[int, typer.Option(help="Batches per update (gradient accumulation).")] = 1,
    max_steps: Annotated[int, typer.Option(help="Stop after this many updates (0: no limit).")] = 0,
    epochs: Annotated[int, typer.Option(help="Stop after this many epochs (0: no limit).")] = 0,
    max_minutes: Annotated[float, typer.Option(help="Stop after this much training time.")] = 0.0,
    valid_every: Annotated[int, typer.Option(help="Validate every N updates.")] = 250,
    valid_bleu_size: Annotated[int, typer.Option(help="Sentences for validation BLEU.")] = 300,
    patience: Annotated[int, typer.Option(help="Early stop after N validations w/o gain.")] = 0,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 1234,
    device: Device = "auto",
    precision: Precision = "auto",
    quiet: Quiet = False,
) -> None:
    """Train a tokenizer and a Transformer, then report test BLEU (greedy, sacrebleu).

    Validates every --valid-every updates (loss, perplexity, greedy BLEU), keeps the best model
    by validation BLEU in model.pt and the full state in last.pt. Ctrl-C saves and exits.
    """
    from tformer_cli.config import ModelConfig, TrainConfig
    from tformer_cli.training import Trainer, new_run_dir

    train_cfg = TrainConfig(
        data=data, src_lang=src, tgt_lang=tgt, vocab_size=vocab_size, tokenizer_kind=tokenizer,
        max_tokens=max_tokens, max_len=max_len, lr=lr, warmup=warmup,
        label_smoothing=label_smoothing, clip_norm=clip_norm, accum=accum, max_steps=max_steps,
        max_epochs=epochs, max_minutes=max_minutes, valid_every=valid_every,
        valid_bleu_size=valid_bleu_size, patience=patience, seed=seed, precision=precision,
        device=device,
    )  # fmt: skip
    model_cfg = ModelConfig(
        vocab_size=vocab_size, d_model=d_model, h=heads, d_ff=d_ff, n_encoder_layers=layers,
        n_decoder_layers=layers, dropout=dropout, positional=positional, norm=norm,  # type: ignore[arg-type]
        tie_embeddings=tie,
    )  # fmt: skip
    if positional not in ("sinusoidal", "learned"):
        raise typer.BadParameter("use sinusoidal or learned", param_hint="--positional")
    if norm not in ("post", "pre"):
        raise typer.BadParameter("use post or pre", param_hint="--norm")
    run_dir = resume if resume is not None else new_run_dir(runs_dir, name, data)
    if resume is not None and not (resume / "last.pt").exists():
        raise TformerError(f"cannot resume: {resume}/last.pt does not exist")
    log = Console(stderr=True, quiet=quiet)
    trainer = Trainer(run_dir, model_cfg, train_cfg, resume=resume is not None, console=log)
    result = trainer.run(quiet=quiet)
    if result.test_bleu is not None:
        out.print(f"test BLEU (greedy, sacrebleu): {result.test_bleu:.2f}")
    out.print(f"run: {result.run_dir}")


# ---------------------------------------------------------------------------- translate
def read_inputs(texts: list[str] | None, file: Path | None) -> list[str] | None:
    """Texts from the arguments, a file (``-`` = stdin) or piped stdin; ``None``: interactive."""
    if texts:
        return texts
    if file is not None and str(file) != "-":
        try:
            return file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise TformerError(f"cannot read {file}: {e}") from None
    if file is None and sys.stdin.isatty():
        return None
    return sys.stdin.read().splitlines()


@app.command()
@friendly_errors
def translate(
    texts: Annotated[list[str] | None, typer.Argument(help="Sentences to translate.")] = None,
    model: ModelDir = None,
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="Translate each line of a file (- = stdin).")
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write translations here, not stdout.")
    ] = None,
    beam: Annotated[int, typer.Option("--beam", "-k", min=1, help="Beam size.")] = 5,
    greedy: Annotated[bool, typer.Option("--greedy", help="Greedy search (same as -k 1).")] = False,
    alpha: Annotated[
        float, typer.Option(help="GNMT length penalty: score = log p(Y|X) / ((5+|Y|)/6)^alpha.")
    ] = 0.6,
    nbest: Annotated[
        int,
        typer.Option(min=1, help="Hypotheses per input (<= beam): lines INDEX<TAB>SCORE<TAB>TEXT."),
    ] = 1,
    scores: Annotated[
        bool, typer.Option("--scores", help="Prefix each line with its score.")
    ] = False,
    batch_size: Annotated[
        int | None, typer.Option(min=1, help="Sentences per batch (default: by --max-tokens).")
    ] = None,
    max_tokens: Annotated[int, typer.Option(min=1, help="Source tokens per batch.")] = 4096,
    max_len_a: Annotated[
        float, typer.Option(help="Output length limit a*|src|+b tokens: a.", show_default=True)
    ] = 1.5,
    max_len_b: Annotated[int, typer.Option(help="Output length limit: b.")] = 10,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Recompute every prefix each step (slow; teaching).")
    ] = False,
    json_out: Annotated[
        bool, typer.Option("--json", help="One JSON object per input: hypotheses, scores, timing.")
    ] = False,
    device: Device = "auto",
    precision: Annotated[str, typer.Option(help="fp32, bf16 or auto.")] = "fp32",
    quiet: Quiet = False,
) -> None:
    """Translate sentences (beam search with a KV cache; results in input order).

    Reads the texts given, else --file, else piped stdin; on a terminal with nothing given it
    asks for sentences one by one. Sorts inputs by length into batches.
    """
    from tformer_cli.checkpoint import atomic_write_text, load_run
    from tformer_cli.config import DecodeConfig
    from tformer_cli.decoding import translate_texts

    k = 1 if greedy else beam
    if nbest > k:
        raise typer.BadParameter(f"--nbest {nbest} needs --beam >= {nbest}", param_hint="--nbest")
    inputs = read_inputs(texts, file)
    run = load_run(model, device, precision)
    cfg = DecodeConfig(beam=k, alpha=alpha, max_len_a=max_len_a, max_len_b=max_len_b, nbest=nbest)
    style = "json" if json_out else "nbest" if nbest > 1 else "scores" if scores else "plain"
    if inputs is None:  # a terminal and nothing to read: ask
        err.print("Type a sentence and press Enter; Ctrl-D quits.")
        while True:
            try:
                line = input("> ")
            except EOFError:
                return
            result = translate_texts(run, [line], cfg, use_cache=not no_cache)
            out.print(format_translations(result, style)[0], markup=False)
    with make_progress("translate", err, disable=quiet or len(inputs) < 100) as progress:
        task = progress.add_task("translate", total=len(inputs), info="")
        results = translate_texts(
            run, inputs, cfg, max_tokens, not no_cache, batch_size,
            on_batch=lambda n: progress.advance(task, n),
        )  # fmt: skip
    text = "".join(f"{line}\n" for line in format_translations(results, style))
    if output is not None:
        atomic_write_text(output, text)
    else:
        sys.stdout.write(text)


def format_translations(results: list[TextTranslation], style: str) -> list[str]:
    """One line per input (``plain``, ``scores``, ``json``) or per hypothesis (``nbest``)."""
    lines = []
    for i, r in enumerate(results):
        pairs = list(zip(r.translations, r.hypotheses, strict=True))
        if style == "json":
            hyps = [
                {"translation": t, "score": h.score, "logprob": h.logprob, "finished": h.finished}
                for t, h in pairs
            ]
            record = {"index": i, "source": r.source, "hypotheses": hyps, "ms": 1000 * r.seconds}
            lines.append(json.dumps(record, ensure_ascii=False))
        elif style == "nbest":
            lines += [f"{i}\t{h.score:.4f}\t{t}" for t, h in pairs]
        elif style == "scores":
            lines.append(f"{pairs[0][1].score:.4f}\t{pairs[0][0]}")
        else:
            lines.append(pairs[0][0])
    return lines


# ---------------------------------------------------------------------------- inspect-attention
@app.command("inspect-attention")
@friendly_errors
def inspect_attention(
    text: Annotated[str, typer.Argument(help="The sentence to translate and inspect.")],
    model: ModelDir = None,
    beam: Annotated[
        int, typer.Option("--beam", "-k", min=1, help="Beam size (1 = greedy); the best is shown.")
    ] = 1,
    kind: Annotated[
        str, typer.Option(help="cross (target -> source), encoder or decoder self-attention.")
    ] = "cross",
    layer: Annotated[str, typer.Option(help="Layer number (from 1), last or all.")] = "last",
    head: Annotated[str, typer.Option(help="Head number (from 1), mean or all.")] = "all",
    save: Annotated[
        Path | None, typer.Option(help="Write a picture: .svg, .html (self-contained) or .png.")
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write every weight with its tokens as JSON.")
    ] = None,
    align: Annotated[
        bool, typer.Option(help="Score cross-attention heads against the toy gold alignments.")
    ] = True,
    align_sentences: Annotated[
        int, typer.Option(min=1, help="Toy test sentences for the alignment accuracy.")
    ] = 200,
    device: Device = "auto",
    precision: Annotated[str, typer.Option(help="fp32, bf16 or auto.")] = "fp32",
) -> None:
    """Translate a sentence and show what every attention head looks at.

    Prints a heatmap per head (rows: target tokens, columns: source tokens for cross-attention)
    and a per-head table: attention entropy and, for runs trained on the toy corpus, how often
    the head's strongest source word is the gold-aligned one on the toy test split.
    """
    from tformer_cli.attention_view import inspect_attention as run_inspect

    run_inspect(
        text, model, out, err, beam=beam, kind=kind, layer=layer, head=head, save=save,
        json_path=json_out, align=align, align_sentences=align_sentences, device=device,
        precision=precision,
    )  # fmt: skip


# ---------------------------------------------------------------------------- tokenizer
@tokenizer_app.command("train")
@friendly_errors
def tokenizer_train(
    output: Annotated[Path, typer.Argument(help="Where to write tokenizer.json.")],
    data: Annotated[str, typer.Option(help="Corpus: toy, a folder or file, or hf:NAME.")] = "toy",
    src: Annotated[str | None, typer.Option(help="Source language suffix of plain files.")] = None,
    tgt: Annotated[str | None, typer.Option(help="Target language suffix of plain files.")] = None,
    vocab_size: Annotated[int, typer.Option(help="Vocabulary size.")] = 8000,
    kind: Annotated[str, typer.Option(help="bpe, unigram or wordlevel.")] = "bpe",
) -> None:
    """Train a shared source+target tokenizer and print its statistics on the validation split."""
    from tformer_cli.corpus import load_corpus
    from tformer_cli.tokenizer import save_tokenizer, tokenizer_stats, train_tokenizer

    corpus = load_corpus(data, src_lang=src, tgt_lang=tgt)
    tok = train_tokenizer([*corpus["train"]["src"], *corpus["train"]["tgt"]], vocab_size, kind)
    save_tokenizer(tok, output)
    for side in ("src", "tgt"):
        stats = tokenizer_stats(tok, corpus["valid"][side])
        out.print(
            f"valid {side}: {stats.sentences} sentences, {stats.avg_tokens:.1f} tokens/sentence,"
            f" unknown rate {stats.unk_rate:.2%}"
        )
    out.print(f"vocabulary: {tok.get_vocab_size()} types -> {output}")


def main() -> None:
    """Console-script entry point."""
    app(prog_name="tformer")
