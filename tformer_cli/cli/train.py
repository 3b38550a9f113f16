"""`tformer train` and `tformer average`."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from tformer_cli.cli.app import (
    Command,
    app,
    err,
    friendly_errors,
    out,
    positional,
)
from tformer_cli.cli.options import (
    Device,
    M,
    Precision,
    Quiet,
    T,
    declared,
    with_options,
)
from tformer_cli.config import (
    MAX_SEED,
    MAX_VOCAB,
    load_recipe,
)
from tformer_cli.console import StopOnClosedPipe
from tformer_cli.errors import TformerError

# ---------------------------------------------------------------------------- train


# Every option of tformer train, in the order of its help.
TRAIN = declared(
    data=(
        Annotated[
            str,
            typer.Option(
                help="toy (bundled), a folder, a .tsv/.jsonl file, or hf:NAME[:CONFIG] (or"
                " --src-file"
                " and --tgt-file)."
            ),
        ],
        T.data,
    ),
    src=(Annotated[str | None, typer.Option(help="Source language suffix of plain files.")], None),
    tgt=(Annotated[str | None, typer.Option(help="Target language suffix of plain files.")], None),
    src_file=(
        Annotated[
            Path | None,
            typer.Option(
                help="Plain source file (one sentence a line, e.g. train.de), the train split with"
                " --tgt-file, instead of --data; valid/test are carved from it unless given."
            ),
        ],
        None,
    ),
    tgt_file=(
        Annotated[
            Path | None, typer.Option(help="Plain target file, line by line with --src-file.")
        ],
        None,
    ),
    valid_src_file=(
        Annotated[
            Path | None,
            typer.Option(help="Plain source file of the valid split, with --valid-tgt-file."),
        ],
        None,
    ),
    valid_tgt_file=(
        Annotated[Path | None, typer.Option(help="Plain target file of the valid split.")],
        None,
    ),
    preset=(
        Annotated[
            str | None,
            typer.Option(
                help="Recipe: toy, multi30k, multi30k-15min or a .toml file; options given here"
                " win."
            ),
        ],
        None,
    ),
    name=(
        Annotated[str | None, typer.Option(help="Run name: runs/NAME. Default: data+time.")],
        None,
    ),
    runs_dir=(Annotated[Path, typer.Option(help="Folder holding the runs.")], Path("runs")),
    resume=(
        Annotated[
            Path | None, typer.Option(help="Continue the run in this folder from its last.pt.")
        ],
        None,
    ),
    vocab_size=(
        Annotated[int, typer.Option(max=MAX_VOCAB, help="Shared subword vocabulary size.")],
        T.vocab_size,
    ),
    tokenizer=(Annotated[str, typer.Option(help="bpe, unigram or wordlevel.")], T.tokenizer_kind),
    tokenizer_sample=(
        Annotated[int, typer.Option(help="Train the tokenizer on at most N sentences (0: all).")],
        T.tokenizer_sample,
    ),
    tokenizer_file=(
        Annotated[
            Path | None,
            typer.Option(
                help="Use this tokenizer (from tformer tokenizer train, or any tokenizers JSON with"
                " <pad>=0 <unk>=1 <s>=2 </s>=3) instead of training one."
            ),
        ],
        None,
    ),
    init_from=(
        Annotated[
            Path | None,
            typer.Option(
                help="Fine-tune: start from this run's weights and tokenizer, with its model"
                " settings (a new optimizer and schedule)."
            ),
        ],
        None,
    ),
    d_model=(Annotated[int, typer.Option(help="Model width d_model.")], M.d_model),
    heads=(Annotated[int, typer.Option(help="Attention heads h.")], M.h),
    d_ff=(Annotated[int, typer.Option(help="Inner width of the feed-forward layers.")], M.d_ff),
    layers=(
        Annotated[int, typer.Option(help="Encoder and decoder layers (each).")],
        M.n_encoder_layers,
    ),
    dropout=(
        Annotated[float, typer.Option(help="Dropout on embeddings and sublayers.")],
        M.dropout,
    ),
    positional=(Annotated[str, typer.Option(help="sinusoidal or learned.")], M.positional),
    norm=(Annotated[str, typer.Option(help="post: LayerNorm(x + f(x)) (paper), or pre.")], M.norm),
    tie=(Annotated[bool, typer.Option(help="Tie embeddings and output layer.")], M.tie_embeddings),
    max_tokens=(Annotated[int, typer.Option(help="Batch size in padded tokens.")], T.max_tokens),
    max_len=(Annotated[int, typer.Option(help="Skip longer training pairs (tokens).")], T.max_len),
    lr=(Annotated[float, typer.Option(help="Peak learning rate (AdamW).")], T.lr),
    warmup=(Annotated[int, typer.Option(help="Warm-up steps, then --decay.")], T.warmup),
    decay=(
        Annotated[
            str,
            typer.Option(
                help="After warm-up: rsqrt (1/sqrt, the paper's), linear or cosine to 0 at the end"
                " of --max-minutes or --max-steps, or auto (linear with --max-minutes, else rsqrt)."
            ),
        ],
        T.decay,
    ),
    label_smoothing=(Annotated[float, typer.Option(help="Label smoothing.")], T.label_smoothing),
    clip_norm=(Annotated[float, typer.Option(help="Max gradient norm (0: off).")], T.clip_norm),
    accum=(Annotated[int, typer.Option(help="Batches per update.")], T.accum),
    max_steps=(Annotated[int, typer.Option(help="Stop after N updates (0: none).")], T.max_steps),
    epochs=(Annotated[int, typer.Option(help="Stop after N epochs (0: none).")], T.max_epochs),
    max_minutes=(Annotated[float, typer.Option(help="Stop after this time.")], T.max_minutes),
    valid_every=(Annotated[int, typer.Option(help="Validate every N updates.")], T.valid_every),
    valid_bleu_size=(
        Annotated[int, typer.Option(help="Validation sentences for BLEU.")],
        T.valid_bleu_size,
    ),
    save_every=(
        Annotated[
            float,
            typer.Option(
                help="Save last.pt at least every N minutes, besides each validation (0: only"
                " at validations). A killed run loses at most this much work."
            ),
        ],
        T.save_every,
    ),
    patience=(
        Annotated[int, typer.Option(help="Early stop after N validations without gain (0: off).")],
        T.patience,
    ),
    average=(
        Annotated[
            int,
            typer.Option(
                help="Keep the last N validation checkpoints; at the end their mean becomes"
                " model.pt"
                " if it validates at least as well as the best one (0: off)."
            ),
        ],
        T.average,
    ),
    beam_alpha=(
        Annotated[
            float,
            typer.Option(
                help="The length penalty (GNMT alpha) of this run's beam search when translate,"
                " eval"
                " or serve is given no --alpha."
            ),
        ],
        T.beam_alpha,
    ),
    scheduled_sampling=(
        Annotated[
            str, typer.Option(help="Scheduled sampling: off, linear, exp or inverse-sigmoid.")
        ],
        T.scheduled_sampling,
    ),
    ss_k=(
        Annotated[
            float | None,
            typer.Option(
                help="Schedule constant: linear 1-k*i, exp k^i, inverse-sigmoid k/(k+e^(i/k))."
            ),
        ],
        T.ss_k,
    ),
    ss_min=(Annotated[float, typer.Option(help="Floor of the linear schedule.")], T.ss_min),
    ss_warmup=(Annotated[int, typer.Option(help="Updates of pure teacher forcing first.")], 0),
    ss_mix=(Annotated[str, typer.Option(help="Model tokens by argmax or sample.")], T.ss_mix),
    ss_tau=(Annotated[float, typer.Option(help="Sampling temperature.")], T.ss_tau),
    seed=(Annotated[int, typer.Option(min=0, max=MAX_SEED, help="Random seed.")], T.seed),
    device=(Device, T.device),
    precision=(Precision, T.precision),
    compile=(
        Annotated[
            str,
            typer.Option(
                help="torch.compile the forward pass and loss: on, off, or auto (eager: compiling"
                " was no faster, on CPU or CUDA: docs/speed.md)."
            ),
        ],
        T.compile,
    ),
    tensorboard=(
        Annotated[
            Path | None,
            typer.Option(
                help="Also write the log's numbers here for TensorBoard (needs tensorboard)."
            ),
        ],
        None,
    ),
    nproc=(
        Annotated[
            int,
            typer.Option(
                min=1,
                help="Train with N processes (DDP under torchrun: one per GPU, or N sharing the"
                " CPU cores). Each update takes max(--accum, N) batches, one share per process.",
            ),
        ],
        1,
    ),
    nnodes=(
        Annotated[
            str, typer.Option(help="Machines taking part, passed to torchrun (e.g. 2, or 1:4).")
        ],
        "1",
    ),
    rdzv_endpoint=(
        Annotated[
            str | None,
            typer.Option(help="HOST:PORT where the machines meet (torchrun --rdzv-endpoint)."),
        ],
        None,
    ),
    quiet=(Quiet, False),
)


def configs(ctx: typer.Context, values: dict[str, Any], log: Console) -> tuple[Any, Any, Path]:
    """The model and training settings and the run folder: a new run's (the recipe, then the
    options given), or a resumed one's own (with the stopping rules and --device given)."""
    from tformer_cli.training.setup import (
        TRAIN_OPTIONS,
        new_configs,
        new_run_dir,
        resume_options,
        resumed_configs,
    )

    def given(names: Iterable[str]) -> dict[str, Any]:  # set on the command line, not defaults
        sources = {o: ctx.get_parameter_source(o) for o in names}  # click's enum, or typer's
        known = [o for o, source in sources.items() if source is not None]
        return {o: values[o] for o in known if sources[o].name != "DEFAULT"}

    options, resume = given(TRAIN_OPTIONS), values["resume"]
    if resume is not None:
        overrides, ignored = resume_options({**options, **given(("preset", "name", "runs_dir"))})
        say = functools.partial(log.print, markup=False)
        return (*resumed_configs(resume, overrides, ignored, say), resume)
    recipe = load_recipe(values["preset"]) if values["preset"] else {}
    model_cfg, train_cfg = new_configs(options, recipe)
    if model_cfg.positional not in ("sinusoidal", "learned"):
        raise typer.BadParameter("use sinusoidal or learned", param_hint="--positional")
    if model_cfg.norm not in ("post", "pre"):
        raise typer.BadParameter("use post or pre", param_hint="--norm")
    return model_cfg, train_cfg, new_run_dir(values["runs_dir"], values["name"], train_cfg.data)


@app.command(cls=Command)
@friendly_errors
@with_options(TRAIN)
def train(ctx: typer.Context, **values: Any) -> None:
    """Train a tokenizer and a Transformer, then report test BLEU (greedy, sacrebleu).

    Validates every --valid-every updates (loss, perplexity, greedy BLEU), keeps the best model
    by validation BLEU in model.pt and the full state in last.pt. Ctrl-C saves and exits (code 130).
    Defaults train the bundled toy corpus in a few minutes; --preset multi30k for real data.
    """
    from tformer_cli.training.distributed import LAUNCHED, launch
    from tformer_cli.training.trainer import Trainer

    nproc, nnodes, quiet = values["nproc"], values["nnodes"], values["quiet"]
    if nproc > 1 or nnodes != "1":  # the same command, once per process, under torchrun
        if os.environ.get("WORLD_SIZE"):
            raise TformerError("--nproc starts torchrun itself: not under torchrun")
        raise typer.Exit(launch(nproc, sys.argv[2:], nnodes, values["rdzv_endpoint"]))
    log = Console(file=StopOnClosedPipe(sys.stderr), quiet=quiet, log_path=False)
    model_cfg, train_cfg, run_dir = configs(ctx, values, log)
    trainer = Trainer(
        run_dir, model_cfg, train_cfg, resume=values["resume"] is not None, console=log,
        tensorboard=values["tensorboard"],
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
@app.command("average", cls=Command)
@friendly_errors
def average_checkpoints(
    legacy: Annotated[
        Path | None, typer.Argument(help="Deprecated: use -m RUN.", hidden=True, metavar="RUN")
    ] = None,
    model: Annotated[
        Path | None,
        typer.Option(
            "--model",
            "-m",
            help="Run trained with --average N. Default: the newest run.",
            show_default=False,
        ),
    ] = None,
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
    from tformer_cli.checkpoint import average_run, resolve_run

    run = positional(legacy, model, "tformer average RUN", "tformer average -m RUN")
    paths, target = average_run(resolve_run(run), last, output)
    out.print(
        f"averaged {len(paths)} checkpoints ({paths[0].stem} to {paths[-1].stem}) -> {target}",
        markup=False,
    )
