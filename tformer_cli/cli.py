"""The `tformer` command line: options, help text and error messages. The work happens elsewhere."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from tformer_cli import __version__
from tformer_cli.config import (
    MAX_SEED,
    MAX_VOCAB,
    DecodeConfig,
    ModelConfig,
    SamplingConfig,
    TrainConfig,
    load_recipe,
)
from tformer_cli.console import StopOnClosedPipe, make_progress
from tformer_cli.errors import TformerError

F = TypeVar("F", bound=Callable[..., Any])

app = typer.Typer(
    name="tformer",
    help="Train, run and study a from-scratch Transformer for machine translation.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)
tokenizer_app = typer.Typer(
    help="Try subword tokenizers on a corpus before training (tformer train makes its own).",
    no_args_is_help=True,
)
app.add_typer(tokenizer_app, name="tokenizer")

# Upper bounds of options that size memory or seed a generator: past them, a one-line error
# rather than torch's overflow or allocation traceback.
MAX_BEAM, MAX_HYPOTHESES = 256, 1024

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
            err.print(f"[bold red]Error:[/] {escape(str(e))}", highlight=False)
            raise typer.Exit(1) from None
        except BrokenPipeError:  # our reader left (`tformer translate ... | head`): stop quietly
            with contextlib.suppress(OSError, ValueError):  # and no second error at exit's flush
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(141) from None  # 128 + SIGPIPE, as a shell reports `cat | head`
        except OSError as e:  # a file we were told to read or write: name it, no traceback
            if os.environ.get("TFORMER_DEBUG"):
                raise
            where = f" ({e.filename})" if e.filename else ""
            message = escape(f"{e.strerror or e}{where}")
            err.print(f"[bold red]Error:[/] {message}", highlight=False)
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
# translate and eval
Models = Annotated[
    list[Path] | None,
    typer.Option(
        "--model",
        "-m",
        help="Run folder; several (-m A -m B) decode as an ensemble (mean of their next-token"
        " probabilities; one shared tokenizer). Default: the newest run under runs/.",
        show_default=False,
    ),
]
Sample = Annotated[
    bool, typer.Option("--sample", help="Draw each token from the model instead of searching.")
]
Temperature = Annotated[
    float, typer.Option(help="Sampling: p^(1/T), renormalised (< 1 sharper, > 1 flatter).")
]
TopK = Annotated[int | None, typer.Option(help="Sampling: keep the k most probable tokens.")]
TopP = Annotated[
    float | None, typer.Option(help="Sampling: keep the smallest set of mass >= p (nucleus).")
]
Epsilon = Annotated[
    float | None, typer.Option(help="Sampling: drop tokens of probability < epsilon.")
]
Mbr = Annotated[
    int,
    typer.Option(
        min=0,
        max=MAX_HYPOTHESES,
        help="Minimum Bayes risk: the candidate of highest expected utility among N samples"
        " (or the beam's N-best, --mbr-from beam). 0: off.",
    ),
]
MbrFrom = Annotated[str, typer.Option(help="Where MBR candidates come from: sample or beam.")]
MbrUtility = Annotated[str, typer.Option(help="MBR utility: chrf (sacrebleu's) or bleu.")]
MinLen = Annotated[int, typer.Option(min=0, help="No </s> before this many tokens.")]
Compile = Annotated[
    str,
    typer.Option(
        help="The decode step: auto (CUDA graphs on a GPU; eager on CPU, where compiling"
        " measured slower), on (torch.compile on CPU) or off (eager)."
    ),
]


# eval and compare
Split = Annotated[
    str, typer.Option(help="train, valid, test, or all: every pair of --data, in order.")
]
Limit = Annotated[int | None, typer.Option(min=1, help="Evaluate only the first N sentence pairs.")]
EvalBeam = Annotated[
    int,
    typer.Option(
        "--beam", "-k", min=1, max=MAX_BEAM, help="Beam size besides greedy (1: greedy only)."
    ),
]
Alpha = Annotated[
    float | None,
    typer.Option(
        help="GNMT length penalty of beam search (score / lp(Y)^alpha). Default: the (first)"
        " run's --beam-alpha, 0.6 unless its training set another."
    ),
]
NoiseSeed = Annotated[
    int, typer.Option(min=0, max=MAX_SEED, help="Seed of the prefix-noise draws.")
]
Threads = Annotated[
    int,
    typer.Option(
        min=0, max=1024, help="CPU threads. 0: $TFORMER_THREADS, else the cores left idle."
    ),
]

# ---------------------------------------------------------------------------- train
M, T = ModelConfig(vocab_size=0), TrainConfig()  # the defaults shown in --help


@app.command()
@friendly_errors
def train(
    ctx: typer.Context,
    data: Annotated[
        str,
        typer.Option(
            help="toy (bundled), a folder, a .tsv/.jsonl file, or hf:NAME[:CONFIG] (or --src-file"
            " and --tgt-file)."
        ),
    ] = T.data,
    src: Annotated[str | None, typer.Option(help="Source language suffix of plain files.")] = None,
    tgt: Annotated[str | None, typer.Option(help="Target language suffix of plain files.")] = None,
    src_file: Annotated[
        Path | None,
        typer.Option(
            help="Plain source file (one sentence a line, e.g. train.de), the train split with"
            " --tgt-file, instead of --data; valid/test are carved from it unless given."
        ),
    ] = None,
    tgt_file: Annotated[
        Path | None, typer.Option(help="Plain target file, line by line with --src-file.")
    ] = None,
    valid_src_file: Annotated[
        Path | None,
        typer.Option(help="Plain source file of the valid split, with --valid-tgt-file."),
    ] = None,
    valid_tgt_file: Annotated[
        Path | None, typer.Option(help="Plain target file of the valid split.")
    ] = None,
    preset: Annotated[
        str | None,
        typer.Option(
            help="Recipe: toy, multi30k, multi30k-15min or a .toml file; options given here win."
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option(help="Run name: runs/NAME. Default: data+time.")
    ] = None,
    runs_dir: Annotated[Path, typer.Option(help="Folder holding the runs.")] = Path("runs"),
    resume: Annotated[
        Path | None, typer.Option(help="Continue the run in this folder from its last.pt.")
    ] = None,
    vocab_size: Annotated[
        int, typer.Option(max=MAX_VOCAB, help="Shared subword vocabulary size.")
    ] = T.vocab_size,
    tokenizer: Annotated[str, typer.Option(help="bpe, unigram or wordlevel.")] = T.tokenizer_kind,
    tokenizer_sample: Annotated[
        int, typer.Option(help="Train the tokenizer on at most N sentences (0: all).")
    ] = T.tokenizer_sample,
    tokenizer_file: Annotated[
        Path | None,
        typer.Option(
            help="Use this tokenizer (from tformer tokenizer train, or any tokenizers JSON with"
            " <pad>=0 <unk>=1 <s>=2 </s>=3) instead of training one."
        ),
    ] = None,
    init_from: Annotated[
        Path | None,
        typer.Option(
            help="Fine-tune: start from this run's weights and tokenizer, with its model"
            " settings (a new optimizer and schedule)."
        ),
    ] = None,
    d_model: Annotated[int, typer.Option(help="Model width d_model.")] = M.d_model,
    heads: Annotated[int, typer.Option(help="Attention heads h.")] = M.h,
    d_ff: Annotated[int, typer.Option(help="Inner width of the feed-forward layers.")] = M.d_ff,
    layers: Annotated[
        int, typer.Option(help="Encoder and decoder layers (each).")
    ] = M.n_encoder_layers,
    dropout: Annotated[
        float, typer.Option(help="Dropout on embeddings and sublayers.")
    ] = M.dropout,
    positional: Annotated[str, typer.Option(help="sinusoidal or learned.")] = M.positional,
    norm: Annotated[str, typer.Option(help="post: LayerNorm(x + f(x)) (paper), or pre.")] = M.norm,
    tie: Annotated[bool, typer.Option(help="Tie embeddings and output layer.")] = M.tie_embeddings,
    max_tokens: Annotated[int, typer.Option(help="Batch size in padded tokens.")] = T.max_tokens,
    max_len: Annotated[int, typer.Option(help="Skip longer training pairs (tokens).")] = T.max_len,
    lr: Annotated[float, typer.Option(help="Peak learning rate (AdamW).")] = T.lr,
    warmup: Annotated[int, typer.Option(help="Warm-up steps, then --decay.")] = T.warmup,
    decay: Annotated[
        str,
        typer.Option(
            help="After warm-up: rsqrt (1/sqrt, the paper's), linear or cosine to 0 at the end"
            " of --max-minutes/--max-steps, or auto (linear with --max-minutes, else rsqrt)."
        ),
    ] = T.decay,
    label_smoothing: Annotated[float, typer.Option(help="Label smoothing.")] = T.label_smoothing,
    clip_norm: Annotated[float, typer.Option(help="Max gradient norm (0: off).")] = T.clip_norm,
    accum: Annotated[int, typer.Option(help="Batches per update.")] = T.accum,
    max_steps: Annotated[int, typer.Option(help="Stop after N updates (0: none).")] = T.max_steps,
    epochs: Annotated[int, typer.Option(help="Stop after N epochs (0: none).")] = T.max_epochs,
    max_minutes: Annotated[float, typer.Option(help="Stop after this time.")] = T.max_minutes,
    valid_every: Annotated[int, typer.Option(help="Validate every N updates.")] = T.valid_every,
    valid_bleu_size: Annotated[
        int, typer.Option(help="Validation sentences for BLEU.")
    ] = T.valid_bleu_size,
    save_every: Annotated[
        float,
        typer.Option(
            help="Save last.pt at least every N minutes, besides each validation (0: only"
            " at validations). A killed run loses at most this much work."
        ),
    ] = T.save_every,
    patience: Annotated[
        int, typer.Option(help="Early stop after N validations without gain (0: off).")
    ] = T.patience,
    average: Annotated[
        int,
        typer.Option(
            help="Keep the last N validation checkpoints; at the end their mean becomes model.pt"
            " if it validates at least as well as the best one (0: off)."
        ),
    ] = T.average,
    beam_alpha: Annotated[
        float,
        typer.Option(
            help="The length penalty (GNMT alpha) of this run's beam search when translate, eval"
            " or serve is given no --alpha."
        ),
    ] = T.beam_alpha,
    scheduled_sampling: Annotated[
        str, typer.Option(help="Scheduled sampling: off, linear, exp or inverse-sigmoid.")
    ] = T.scheduled_sampling,
    ss_k: Annotated[
        float | None,
        typer.Option(
            help="Schedule constant: linear 1-k*i, exp k^i, inverse-sigmoid k/(k+e^(i/k))."
        ),
    ] = T.ss_k,
    ss_min: Annotated[float, typer.Option(help="Floor of the linear schedule.")] = T.ss_min,
    ss_warmup: Annotated[int, typer.Option(help="Updates of pure teacher forcing first.")] = 0,
    ss_mix: Annotated[str, typer.Option(help="Model tokens by argmax or sample.")] = T.ss_mix,
    ss_tau: Annotated[float, typer.Option(help="Sampling temperature.")] = T.ss_tau,
    seed: Annotated[int, typer.Option(min=0, max=MAX_SEED, help="Random seed.")] = T.seed,
    device: Device = T.device,
    precision: Precision = T.precision,
    compile: Annotated[
        str,
        typer.Option(
            help="torch.compile the forward pass and loss: on, off, or auto (eager: compiling"
            " measured no faster, on CPU or CUDA)."
        ),
    ] = T.compile,
    tensorboard: Annotated[
        Path | None,
        typer.Option(help="Also write the log's numbers here for TensorBoard (needs tensorboard)."),
    ] = None,
    nproc: Annotated[
        int,
        typer.Option(
            min=1,
            help="Train with N processes (DDP under torchrun: one per GPU, or N sharing the"
            " CPU cores). Each update takes max(--accum, N) batches, one share per process.",
        ),
    ] = 1,
    nnodes: Annotated[
        str, typer.Option(help="Machines taking part, passed to torchrun (e.g. 2, or 1:4).")
    ] = "1",
    rdzv_endpoint: Annotated[
        str | None,
        typer.Option(help="HOST:PORT where the machines meet (torchrun --rdzv-endpoint)."),
    ] = None,
    quiet: Quiet = False,
) -> None:
    """Train a tokenizer and a Transformer, then report test BLEU (greedy, sacrebleu).

    Validates every --valid-every updates (loss, perplexity, greedy BLEU), keeps the best model
    by validation BLEU in model.pt and the full state in last.pt. Ctrl-C saves and exits (code 130).
    Defaults train the bundled toy corpus in a few minutes; --preset multi30k for real data.
    """
    from tformer_cli.training.distributed import LAUNCHED, launch
    from tformer_cli.training.setup import (
        TRAIN_OPTIONS,
        new_configs,
        new_run_dir,
        resume_options,
        resumed_configs,
    )
    from tformer_cli.training.trainer import Trainer

    if nproc > 1 or nnodes != "1":  # the same command, once per process, under torchrun
        if os.environ.get("WORLD_SIZE"):
            raise TformerError("--nproc starts torchrun itself: not under torchrun")
        raise typer.Exit(launch(nproc, sys.argv[2:], nnodes, rdzv_endpoint))

    recipe = load_recipe(preset) if preset else {}

    def given(options: Iterable[str]) -> dict[str, Any]:  # set on the command line, not defaults
        sources = {o: ctx.get_parameter_source(o) for o in options}  # click's enum, or typer's
        known = [o for o, source in sources.items() if source is not None]
        return {o: ctx.params[o] for o in known if sources[o].name != "DEFAULT"}

    options = given(TRAIN_OPTIONS)
    log = Console(file=StopOnClosedPipe(sys.stderr), quiet=quiet, log_path=False)
    if resume is not None:  # the run's own settings; given stopping rules and --device win
        overrides, ignored = resume_options({**options, **given(("preset", "name", "runs_dir"))})
        say = functools.partial(log.print, markup=False)
        model_cfg, train_cfg = resumed_configs(resume, overrides, ignored, say)
        run_dir = resume
    else:
        model_cfg, train_cfg = new_configs(options, recipe)
        if model_cfg.positional not in ("sinusoidal", "learned"):
            raise typer.BadParameter("use sinusoidal or learned", param_hint="--positional")
        if model_cfg.norm not in ("post", "pre"):
            raise typer.BadParameter("use post or pre", param_hint="--norm")
        run_dir = new_run_dir(runs_dir, name, train_cfg.data)
    trainer = Trainer(
        run_dir, model_cfg, train_cfg, resume=resume is not None, console=log,
        tensorboard=tensorboard,
    )  # fmt: skip
    try:
        result = trainer.run(quiet=quiet)
    finally:
        trainer.close()
    # a stop after a Ctrl-C: exit 130 as an interrupted program does (so that `&&` stops here);
    # the workers of `--nproc` exit 0, since their launcher says 130 and torchrun stays quiet
    stopped = 0 if os.environ.get(LAUNCHED) else 130
    if not trainer.world.main:  # under torchrun rank 0 alone reports
        raise typer.Exit(stopped if result.interrupted else 0)
    if result.test_bleu is not None:
        out.print(f"test BLEU (greedy, sacrebleu): {result.test_bleu:.2f}")
    out.print(f"run: {result.run_dir}", markup=False)
    if result.interrupted:
        hint = f"interrupted: continue with tformer train --resume {result.run_dir}"
        if not (result.run_dir / "model.pt").exists():
            hint += " (no model.pt yet: translate and eval use the newest run that has one)"
        err.print(hint, markup=False)
        raise typer.Exit(stopped)


# ---------------------------------------------------------------------------- average
@app.command("average")
@friendly_errors
def average_checkpoints(
    run: Annotated[Path, typer.Argument(help="Run folder trained with --average N.")],
    last: Annotated[int, typer.Option(min=2, help="Average the N newest checkpoints.")] = 5,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Where to write the weights. Default: RUN/averaged.pt;"
            " RUN/model.pt makes the average the run's model.",
        ),
    ] = None,
) -> None:
    """Average the parameters of a run's newest validation checkpoints (element-wise, fp32)."""
    from tformer_cli.checkpoint import average_run

    paths, target = average_run(run, last, output)
    out.print(
        f"averaged {len(paths)} checkpoints ({paths[0].stem} to {paths[-1].stem}) -> {target}",
        markup=False,
    )


# ---------------------------------------------------------------------------- translate
def search_config(
    beam: int,
    alpha: float,
    sample: bool,
    sampling: tuple[float, int | None, float | None, float | None],
    mbr: int,
    mbr_from: str,
    mbr_utility: str,
    **rest: Any,
) -> DecodeConfig:
    """The search of translate and eval: beam (``beam`` 1: greedy), ``--sample`` (the
    ``sampling`` settings: temperature, top-k, top-p, epsilon) or ``--mbr`` over samples or
    the beam's n-best; ``rest``: the other ``DecodeConfig`` fields. A sampling setting given
    where nothing is sampled is an error, not ignored."""
    draws = sample or (mbr > 0 and mbr_from == "sample")
    if not draws and sampling != (1.0, None, None, None):
        raise TformerError(
            "--temperature, --top-k, --top-p and --epsilon need --sample or --mbr (from samples)"
        )
    return DecodeConfig(
        beam=1 if draws else beam, alpha=alpha, mbr=mbr, mbr_from=mbr_from,
        sampling=SamplingConfig(*sampling) if draws else None, mbr_utility=mbr_utility, **rest,
    )  # fmt: skip


def run_alpha(alpha: float | None, models: Sequence[Path] | None) -> float:
    """``--alpha`` if given, else the first run's ``beam_alpha`` (the newest run's by default),
    read from its ``config.json``."""
    if alpha is not None:
        return alpha
    from tformer_cli.checkpoint import RunConfig, resolve_run

    return RunConfig.load(resolve_run(models[0] if models else None)).train.beam_alpha


def read_inputs(
    texts: list[str] | None, file: Path | None
) -> tuple[Iterable[str], int | None] | None:
    """The texts to translate and their count if known: the arguments, the lines of a file
    (``-``: stdin) or of piped stdin, read as they come; ``None``: ask on the terminal."""
    from tformer_cli.decode.streams import check_arguments, count_lines, file_lines, read_lines

    if texts and file is not None:
        raise TformerError("give sentences or --file, not both")
    if texts:
        return check_arguments(texts), len(texts)
    if file is not None and str(file) != "-":
        return file_lines(file), count_lines(file)
    if file is None and sys.stdin.isatty():
        return None
    return read_lines(sys.stdin.buffer, "stdin"), None


def write_trace(path: Path, runs: list[Any], texts: list[str], cfg: DecodeConfig) -> None:
    """``--trace``: the step-through search (``Run.trace``) of the first text, as JSON."""
    from tformer_cli.api import Run
    from tformer_cli.files import atomic_write_text

    if not texts or cfg.sampling is not None or cfg.mbr:
        raise TformerError("--trace follows the search of a sentence given as an argument")
    traced = Run(runs, cfg.alpha).trace(texts[0], beam=cfg.beam, top=cfg.beam + 5)
    atomic_write_text(path, traced.to_json() + "\n")


@app.command()
@friendly_errors
def translate(
    texts: Annotated[list[str] | None, typer.Argument(help="Sentences to translate.")] = None,
    model: Models = None,
    file: Annotated[
        Path | None,
        typer.Option("--file", "-f", help="Translate each line of a UTF-8 file (- = stdin)."),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="Write translations here (all at once, at the end), not stdout."
        ),
    ] = None,
    beam: Annotated[int, typer.Option("--beam", "-k", min=1, max=MAX_BEAM, help="Beam size.")] = 5,
    greedy: Annotated[bool, typer.Option("--greedy", help="Greedy search (same as -k 1).")] = False,
    alpha: Annotated[
        float | None,
        typer.Option(
            help="GNMT length penalty: score = log p(Y|X) / ((5+|Y|)/6)^alpha. Default: the"
            " (first) run's --beam-alpha, 0.6 unless its training set another."
        ),
    ] = None,
    nbest: Annotated[
        int,
        typer.Option(
            min=1,
            max=MAX_HYPOTHESES,
            help="Hypotheses per input (<= beam; with --sample, samples per input): lines"
            " INDEX<TAB>SCORE<TAB>TEXT.",
        ),
    ] = 1,
    sample: Sample = False,
    temperature: Temperature = 1.0,
    top_k: TopK = None,
    top_p: TopP = None,
    epsilon: Epsilon = None,
    seed: Annotated[
        int, typer.Option(min=0, max=MAX_SEED, help="Seed of the samples (--sample, --mbr).")
    ] = 0,
    mbr: Mbr = 0,
    mbr_from: MbrFrom = "sample",
    mbr_utility: MbrUtility = "chrf",
    min_len: MinLen = 0,
    scores: Annotated[
        bool, typer.Option("--scores", help="Prefix each line with its score.")
    ] = False,
    batch_size: Annotated[
        int | None, typer.Option(min=1, help="Sentences per batch (default: by --max-tokens).")
    ] = None,
    max_tokens: Annotated[int, typer.Option(min=1, help="Source tokens per batch.")] = 4096,
    chunk_size: Annotated[
        int,
        typer.Option(
            min=1,
            max=1_000_000,
            help="Lines read, translated (sorted by length into batches) and written at a time:"
            " output flows before the input ends, and memory does not grow with it.",
        ),
    ] = 2000,
    max_len_a: Annotated[
        float, typer.Option(help="Output length limit a*|src|+b tokens: a.", show_default=True)
    ] = 1.5,
    max_len_b: Annotated[int, typer.Option(max=100_000, help="Output length limit: b.")] = 10,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Recompute every prefix each step (slow; teaching).")
    ] = False,
    json_out: Annotated[
        bool, typer.Option("--json", help="One JSON object per input: hypotheses, scores, timing.")
    ] = False,
    trace: Annotated[
        Path | None,
        typer.Option(
            help="Write the step-through search of the first text as JSON here: each step's"
            " hypotheses, their best next tokens (kept, pruned or finished), cross-attention."
        ),
    ] = None,
    device: Device = "auto",
    precision: Annotated[
        str, typer.Option(help="fp32, bf16, auto, or int8 (int8 weights, CPU only: faster).")
    ] = "fp32",
    compile: Compile = "auto",
    quiet: Quiet = False,
) -> None:
    """Translate sentences (beam search with a KV cache; results in input order).

    Reads the texts given, else --file, else piped stdin, as UTF-8 lines ending in a newline:
    one output line per input line. Translates --chunk-size lines at a time, each chunk sorted
    by length into batches, and writes each chunk's translations as soon as they are ready. On
    a terminal with nothing given it asks for sentences one by one.
    """
    from tformer_cli.checkpoint import load_runs
    from tformer_cli.decode.streams import (
        format_translations,
        save_translations,
        translate_chunks,
        write_translations,
    )
    from tformer_cli.decode.translate import Batching, translate_texts
    from tformer_cli.device import oom_hint

    if greedy and (sample or mbr):
        raise typer.BadParameter("--greedy searches; --sample and --mbr draw: choose one")
    k = 1 if greedy else beam
    if nbest > k and not (sample or mbr):
        raise typer.BadParameter(f"--nbest {nbest} needs --beam >= {nbest}", param_hint="--nbest")
    cfg = search_config(  # without --alpha: 0 until the run's is read, once the run is loaded
        k, 0.0 if alpha is None else alpha, sample, (temperature, top_k, top_p, epsilon), mbr,
        mbr_from, mbr_utility, max_len_a=max_len_a, max_len_b=max_len_b, nbest=nbest,
        min_len=min_len, seed=seed,
    )  # fmt: skip
    inputs = read_inputs(texts, file)
    run = load_runs(model, device, precision, compile)
    if alpha is None:  # the first run's
        cfg = dataclasses.replace(cfg, alpha=run[0].config.train.beam_alpha)
    if trace is not None:
        write_trace(trace, run, texts or [], cfg)
    style = "json" if json_out else "nbest" if nbest > 1 else "scores" if scores else "plain"
    if inputs is None:  # a terminal and nothing to read: ask
        err.print("Type a sentence and press Enter; Ctrl-D quits.")
        while True:
            try:
                line = input("> ")
            except EOFError:  # Ctrl-D: end the prompt's line
                err.print()
                return
            result = translate_texts(run, [line], cfg, Batching(use_cache=not no_cache))
            out.print(format_translations(result, style)[0], markup=False)
    lines, total = inputs
    few = total < 100 if total is not None else not err.is_terminal  # no bar for a short job
    with make_progress("translate", err, disable=quiet or few) as progress, oom_hint(max_tokens):
        task = progress.add_task("translate", total=total, info="")
        chunks = translate_chunks(
            run, lines, cfg, Batching(max_tokens, batch_size, not no_cache),
            chunk_size=chunk_size, on_batch=lambda n: progress.advance(task, n),
        )  # fmt: skip
        if output is not None:
            count = save_translations(output, chunks, style)
        else:
            count = write_translations(chunks, sys.stdout.buffer, style)
    if not count and not quiet:
        err.print("note: no input sentences: nothing to translate", markup=False)


# ---------------------------------------------------------------------------- inspect-attention
@app.command("inspect-attention")
@friendly_errors
def inspect_attention(
    text: Annotated[str, typer.Argument(help="The sentence to translate and inspect.")],
    model: ModelDir = None,
    beam: Annotated[
        int,
        typer.Option(
            "--beam", "-k", min=1, max=MAX_BEAM, help="Beam size (1 = greedy); the best is shown."
        ),
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
    from tformer_cli.report.attention.view import AttentionRequest
    from tformer_cli.report.attention.view import inspect_attention as run_inspect

    request = AttentionRequest(
        kind=kind, layer=layer, head=head, beam=beam, align=align,
        align_sentences=align_sentences, device=device, precision=precision,
    )  # fmt: skip
    run_inspect(text, model, request, out, err, save=save, json_path=json_out)


# ---------------------------------------------------------------------------- eval
@app.command("eval")
@friendly_errors
def evaluate(
    model: Models = None,
    data: Annotated[
        str | None,
        typer.Option(help="Corpus (as for train). Default: the data the run was trained on."),
    ] = None,
    src: Annotated[str | None, typer.Option(help="Source language. Default: the run's.")] = None,
    tgt: Annotated[str | None, typer.Option(help="Target language. Default: the run's.")] = None,
    src_file: Annotated[
        Path | None,
        typer.Option(
            help="Plain source file (e.g. newstest2014.de): with --tgt-file, score every pair of"
            " the two files, in order, instead of --data."
        ),
    ] = None,
    tgt_file: Annotated[
        Path | None, typer.Option(help="Plain target file, line by line with --src-file.")
    ] = None,
    split: Split = "test",
    limit: Limit = None,
    beam: EvalBeam = 5,
    alpha: Alpha = None,
    json_out: Annotated[
        Path | None,
        typer.Option("--json", help="Write every number, with its settings, as JSON here."),
    ] = None,
    hyp: Annotated[
        Path | None,
        typer.Option(help="Write the hypotheses, one per line: beam if --beam > 1, else greedy."),
    ] = None,
    sample: Sample = False,
    temperature: Temperature = 1.0,
    top_k: TopK = None,
    top_p: TopP = None,
    epsilon: Epsilon = None,
    mbr: Mbr = 0,
    mbr_from: MbrFrom = "sample",
    mbr_utility: MbrUtility = "chrf",
    min_len: MinLen = 0,
    seed: Annotated[
        int,
        typer.Option(
            min=0, max=MAX_SEED, help="Seed of the prefix-noise draws and of the samples."
        ),
    ] = 1234,
    device: Device = "auto",
    precision: Annotated[
        str | None,
        typer.Option(
            help="fp32, bf16, auto, or int8 (int8 weights, CPU only). Default: the precision"
            " the run was trained with."
        ),
    ] = None,
    compile: Compile = "auto",
    threads: Threads = 0,
    quiet: Quiet = False,
) -> None:
    """Score a run: BLEU and chrF (greedy and beam), teacher-forced loss, and exposure bias.

    The exposure-bias sections: the BLEU gap between teacher-forced argmax and greedy output,
    error accumulation when the model reads its own mistakes, accuracy under prefix noise, and
    quality decay with length. Metrics with no defined value print n/a. With several runs
    (-m A -m B), each run's report, then their ensemble's BLEU and chrF.
    """
    from tformer_cli.device import oom_hint
    from tformer_cli.report.eval_run import evaluate_run
    from tformer_cli.report.evaluation import EvalConfig, render_report
    from tformer_cli.report.request import EvalRequest

    search = search_config(
        beam, run_alpha(alpha, model), sample, (temperature, top_k, top_p, epsilon), mbr,
        mbr_from, mbr_utility, min_len=min_len, seed=seed,
    )  # fmt: skip
    request = EvalRequest(
        data=data, src_lang=src, tgt_lang=tgt, src_file=src_file, tgt_file=tgt_file, split=split,
        limit=limit, config=EvalConfig(search, seed=seed), device=device, precision=precision,
        threads=threads, compile=compile,
    )  # fmt: skip
    runs = model or [None]
    for i, run in enumerate(runs):  # each run's report; the last one's ends with the ensemble's
        last = i == len(runs) - 1
        with oom_hint():
            evaluation = evaluate_run(
                run, request, keep=True, json_path=json_out if last else None,
                hyp_path=hyp if last else None, ensemble_with=runs[:-1] if last else (),
                console=err, quiet=quiet,
            )  # fmt: skip
        out.print(render_report(evaluation.report))


# ---------------------------------------------------------------------------- runs, show, compare
@app.command("runs")
@friendly_errors
def runs_command(
    folder: Annotated[
        Path | None,
        typer.Argument(help="Folder holding the runs. Default: runs/.", show_default=False),
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print every row as JSON instead of the table.")
    ] = False,
) -> None:
    """List the runs, newest first: data, model size, precision, updates, BLEU and state.

    The state is finished, interrupted (continue it with tformer train --resume RUN), running
    (a live training process holds the run's lock) or broken (with the reason). Test BLEU comes
    from tformer eval's stored result for the current model.pt, else from the end of training.
    """
    from tformer_cli.report.runs import show_runs

    show_runs(folder, out, as_json=json_out)


@app.command("show")
@friendly_errors
def show_command(
    run: Annotated[Path, typer.Argument(help="Run folder, or the name of one under runs/.")],
    save: Annotated[
        Path | None,
        typer.Option(
            help="Write the curves: .svg, .html (self-contained, with the settings) or .png."
        ),
    ] = None,
    x: Annotated[
        str, typer.Option("--x", help="x axis: updates, or time (minutes of training).")
    ] = "updates",
) -> None:
    """Show a run: its settings, then its training curves drawn in the terminal.

    From the run's log.jsonl: train loss, valid loss, perplexity and BLEU, learning rate,
    target tokens/s, and the teacher-forcing probability of scheduled sampling when used.
    """
    from tformer_cli.report.show import show_run

    show_run(run, out, save=save, x=x, err=err)


@app.command("compare")
@friendly_errors
def compare_command(
    runs: Annotated[
        list[Path],
        typer.Argument(
            help="Two or more run folders (or names under runs/); the first is the baseline."
        ),
    ],
    data: Annotated[
        str | None,
        typer.Option(help="Corpus (as for train). Default: the data the runs were trained on."),
    ] = None,
    src: Annotated[str | None, typer.Option(help="Source language. Default: the runs'.")] = None,
    tgt: Annotated[str | None, typer.Option(help="Target language. Default: the runs'.")] = None,
    split: Split = "test",
    limit: Limit = None,
    beam: EvalBeam = 5,
    alpha: Alpha = None,
    seed: NoiseSeed = 1234,
    save: Annotated[
        Path | None,
        typer.Option(
            help="Write the runs' curves overlaid: .svg, .html (with the tables) or .png."
        ),
    ] = None,
    x: Annotated[
        str, typer.Option("--x", help="x axis of --save: updates, or time (minutes of training).")
    ] = "updates",
    json_out: Annotated[
        bool, typer.Option("--json", help="Print every number and p-value as JSON.")
    ] = False,
    device: Device = "auto",
    precision: Annotated[
        str | None,
        typer.Option(help="fp32, bf16 or auto. Default: the precision each run was trained with."),
    ] = None,
    threads: Threads = 0,
    quiet: Quiet = False,
) -> None:
    """Compare runs on the same test data, with significance tests.

    BLEU and chrF (greedy and beam), teacher-forced metrics and the exposure-bias numbers side
    by side with their differences to the first run; for BLEU and chrF, sacrebleu's paired
    bootstrap resampling and paired approximate randomization give each difference a p-value.
    A run's stored tformer eval result is reused when it is current (same model.pt bytes, data
    and settings); otherwise the run is evaluated now and the result kept.
    """
    from tformer_cli.checkpoint import resolve_run
    from tformer_cli.report.compare import compare_runs
    from tformer_cli.report.evaluation import EvalConfig
    from tformer_cli.report.request import EvalRequest

    alpha = run_alpha(alpha, [resolve_run(runs[0])])
    cfg = EvalConfig(DecodeConfig(beam=beam, alpha=alpha), seed=seed)
    request = EvalRequest(
        data=data, src_lang=src, tgt_lang=tgt, split=split, limit=limit, config=cfg,
        device=device, precision=precision, threads=threads,
    )  # fmt: skip
    compare_runs(
        runs, out, request, keep=True, save=save, x=x, as_json=json_out, err=err, quiet=quiet
    )


# ---------------------------------------------------------------------------- serve
@app.command("serve")
@friendly_errors
def serve_command(
    model: ModelDir = None,
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0: all).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8000,
    max_tokens: Annotated[
        int, typer.Option(min=1, help="Source tokens gathered into one decoding batch.")
    ] = 4096,
    wait_ms: Annotated[
        float, typer.Option(min=0, help="How long a batch waits for more requests (ms).")
    ] = 5.0,
    max_chars: Annotated[int, typer.Option(min=1, help="Characters per text.")] = 1000,
    max_texts: Annotated[int, typer.Option(min=1, help="Texts per request.")] = 64,
    max_body: Annotated[int, typer.Option(min=1, help="Bytes per request body.")] = 1 << 20,
    max_beam: Annotated[
        int, typer.Option(min=1, max=MAX_BEAM, help="Largest beam (and n-best).")
    ] = 16,
    timeout: Annotated[
        float, typer.Option(min=0.001, help="Seconds a request may wait and run (then 503).")
    ] = 30.0,
    device: Device = "auto",
    precision: Annotated[str, typer.Option(help="fp32, bf16 or auto.")] = "fp32",
    quiet: Quiet = False,
) -> None:
    """Serve translations and attention maps over HTTP, with a page to explore them at /.

    POST /translate answers with the objects of translate --json, POST /attention with those of
    inspect-attention --json; GET /health, GET /model; the API's own page is /docs. Requests
    that arrive together are decoded in one batch. Needs the serve extra.
    """
    from tformer_cli.serve import Limits, serve

    limits = Limits(max_chars, max_texts, max_body, max_beam, timeout)
    serve(
        model, err, host=host, port=port, limits=limits, max_tokens=max_tokens, wait_ms=wait_ms,
        device=device, precision=precision, quiet=quiet,
    )  # fmt: skip


# ---------------------------------------------------------------------------- export, import
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


@app.command("export")
@friendly_errors
def export_command(
    run: Annotated[Path, typer.Argument(help="Run folder, or the name of one under runs/.")],
    output: Annotated[Path, typer.Argument(help="Folder to write (new, or empty).")],
    to: Annotated[
        str, typer.Option("--to", help="ctranslate2, or hf (a MarianMTModel for transformers).")
    ],
    quantization: Annotated[
        str,
        typer.Option(
            help="CTranslate2 weights: float32, int8, int8_float32, int8_float16, int8_bfloat16,"
            " int16, float16 or bfloat16."
        ),
    ] = "float32",
) -> None:
    """Export a run for deployment or sharing, its tokenizer with it.

    ctranslate2: any run, for CTranslate2's fast decoding (exact: the same weights and position
    table). hf: a run trained post-LN with sinusoidal positions (the toy recipe's), as a
    Hugging Face MarianMTModel folder with a fast tokenizer and a generation config.
    """
    from tformer_cli.checkpoint import resolve_run

    if to not in ("ctranslate2", "hf"):
        raise typer.BadParameter(f"{to!r}: use ctranslate2 or hf", param_hint="--to")
    if to == "hf" and quantization != "float32":
        raise typer.BadParameter("quantizes CTranslate2 weights only", param_hint="--quantization")
    run_dir = resolve_run(run)
    with interop_packages():
        if to == "ctranslate2":
            from tformer_cli.interop.ct2 import export_ctranslate2

            written = export_ctranslate2(run_dir, output, quantization)
        else:
            from tformer_cli.interop.hf import export_hf

            written = export_hf(run_dir, output)
    out.print(f"exported {run_dir} -> {written} ({to})", markup=False)


@app.command("import")
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
    (HF_HUB_OFFLINE=1), hf:NAME reads the Hugging Face cache.
    """
    with interop_packages():
        from tformer_cli.interop.hf import import_marian

        run_dir = import_marian(source, runs_dir, name)
    out.print(f"imported {source} -> {run_dir}", markup=False)


# ---------------------------------------------------------------------------- tokenizer
@tokenizer_app.command("train")
@friendly_errors
def tokenizer_train(
    output: Annotated[Path, typer.Argument(help="Where to write tokenizer.json.")],
    data: Annotated[str, typer.Option(help="Corpus: toy, a folder or file, or hf:NAME.")] = "toy",
    src: Annotated[str | None, typer.Option(help="Source language suffix of plain files.")] = None,
    tgt: Annotated[str | None, typer.Option(help="Target language suffix of plain files.")] = None,
    vocab_size: Annotated[int, typer.Option(max=MAX_VOCAB, help="Vocabulary size.")] = T.vocab_size,
    kind: Annotated[str, typer.Option(help="bpe, unigram or wordlevel.")] = "bpe",
) -> None:
    """Train a shared source+target tokenizer as tformer train would, and print its statistics
    on the validation split: tokens per sentence and unknown rate, to compare --vocab-size and
    --kind choices before training a model."""
    from tformer_cli.data.corpus import load_corpus, training_text
    from tformer_cli.data.tokenizer import save_tokenizer, tokenizer_stats, train_tokenizer

    corpus = load_corpus(data, src_lang=src, tgt_lang=tgt)
    text = training_text(corpus["train"], T.tokenizer_sample)  # as tformer train samples it
    tok = train_tokenizer(text, vocab_size, kind)
    save_tokenizer(tok, output)
    for side in ("src", "tgt"):
        stats = tokenizer_stats(tok, corpus["valid"][side])
        out.print(
            f"valid {side}: {stats.sentences} sentences, {stats.avg_tokens:.1f} tokens/sentence,"
            f" unknown rate {stats.unk_rate:.2%}"
        )
    out.print(f"vocabulary: {tok.get_vocab_size()} types -> {output}", markup=False)


def reflow_help(*apps: typer.Typer) -> None:
    """Join each help paragraph's lines, so the terminal wraps them (Typer keeps a docstring's
    line breaks, which made ragged lines in an 80-column terminal)."""
    for typer_app in apps:
        for info in typer_app.registered_commands:
            doc = inspect.getdoc(info.callback) or ""
            info.help = "\n\n".join(" ".join(p.split("\n")) for p in doc.split("\n\n"))


reflow_help(app, tokenizer_app)


def main() -> None:
    """Console-script entry point: the process-wide settings (``device.setup``), then the app."""
    from tformer_cli.device import setup

    with contextlib.suppress(TformerError):  # $TFORMER_THREADS unreadable: the commands that
        setup()  # set threads (loading a run, training) say so, on one line, as before
    app(prog_name="tformer")
