"""How every command's ``--help`` reads at 80 columns: options grouped in panels, plain metavars
(``RUN``, ``FILE``, ``N``, the choices themselves), no type names, no bounds split across lines.
One table for all commands, so the same option reads the same everywhere."""

from __future__ import annotations

import copy
from typing import Any

# The panel of each option, by its parameter name; the rest stay under "Options".
PANELS: dict[str, tuple[str, ...]] = {
    "Data": ("data", "src", "tgt", "src_file", "tgt_file", "valid_src_file", "valid_tgt_file",
             "split", "limit", "mix", "vocab_size", "tokenizer", "tokenizer_file"),
    "Run": ("model", "preset", "name", "runs_dir", "resume", "init_from"),
    "Model": ("d_model", "heads", "d_ff", "layers", "dropout", "positional", "norm", "tie"),
    "Optimisation": ("max_len", "lr", "warmup", "decay", "label_smoothing", "clip_norm", "accum"),
    "Stopping and checkpoints": ("max_steps", "epochs", "max_minutes", "valid_every",
                                 "valid_bleu_size", "save_every", "patience", "average", "last"),
    "Scheduled sampling": ("scheduled_sampling", "ss_k", "ss_min", "ss_warmup", "ss_mix",
                           "ss_tau"),
    "Search": ("beam", "greedy", "alpha", "beam_alpha", "nbest", "min_len", "max_len_a",
               "max_len_b", "no_cache"),
    "Sampling and MBR": ("sample", "temperature", "top_k", "top_p", "epsilon", "seed", "mbr",
                         "mbr_from", "mbr_utility"),
    "Attention": ("kind", "layer", "head", "align", "align_sentences"),
    "Server": ("host", "port", "max_chars", "max_texts", "max_body", "max_beam", "timeout",
               "wait_ms"),
    "Export": ("to", "quantization"),
    "Output": ("file", "output", "json_out", "scores", "trace", "save", "x", "hypotheses",
               "tensorboard", "force", "quiet"),
    "Hardware": ("device", "precision", "compile", "threads", "batch_size", "max_tokens",
                 "chunk_size"),
    "Several processes": ("nproc", "nnodes", "rdzv_endpoint"),
}  # fmt: skip
PANEL_OF = {name: panel for panel, names in PANELS.items() for name in names}
PANEL_IN = {("train", "seed"): "Run", ("train", "max_tokens"): "Optimisation"}


def metavar(param: Any) -> str:
    """The plain metavar of an option its field declares none for: empty for a flag, FILE for
    a path, N for integers, X for numbers, the choices for a fixed set, TEXT otherwise."""
    if getattr(param, "is_flag", False):
        return ""
    if choices := getattr(allowed(param), "choices", None):
        return "|".join(choices)
    described = getattr(param, "type_descriptor", None)  # typer >= 0.2x; else click's type
    if described is None:
        kind = getattr(getattr(param, "type", None), "name", "")
        return {"path": "FILE", "integer": "N", "float": "X"}.get(
            kind.split()[0] if kind else "", "TEXT"
        )
    if described.is_path:
        return "FILE"
    return {int: "N", float: "X"}.get(described.annotation, "TEXT")


def allowed(param: Any) -> Any:
    """The values an option's parser (``options.Parsed``) takes, or None: from Typer >= 0.29's
    type descriptor or the click type of older Typers."""
    described = getattr(param, "type_descriptor", None)
    parser = described.parameter_info.parser if described else getattr(param.type, "func", None)
    return getattr(parser, "allowed", None)


def nameless(kind: Any) -> Any:
    """``kind`` (a click parameter type), or a copy of it that converts the same but has no
    metavar: help then shows no type name beside an argument."""
    if "get_metavar" in vars(kind):  # already nameless
        return kind
    quiet = copy.copy(kind)  # click's STRING and others are shared: change a copy
    quiet.get_metavar = lambda *args, **kwargs: ""
    return quiet


def usage(argument: Any) -> list[str]:
    """An argument on the usage line, as click writes it: ``TEXT``, ``[RUN]``, ``[TEXTS]...``;
    nothing for a hidden one (an old spelling, kept for a release, that no panel explains)."""
    if argument.hidden:
        return []
    name = argument.metavar if argument.required else f"[{argument.metavar}]"
    return [name + ("..." if argument.nargs != 1 else "")]


def lay_out(command: str, params: list[Any]) -> None:
    """Give each option of ``command`` its panel and plain metavar, and show no bounds in the
    type column (an out-of-range value names them), no type beside an argument, and no hidden
    argument on the usage line."""
    for param in params:
        if param.param_type_name == "argument":  # its name says what it is: no type column
            param.display_type_rich = lambda ctx: None  # typer >= 0.29 (its own types)
            if hasattr(param, "type"):  # click's type, before: 0.27-0.28 show its metavar
                param.type = nameless(param.type)
            param.metavar = param.metavar or param.name.upper()
            param.get_usage_pieces = lambda ctx, argument=param: usage(argument)
        if param.param_type_name != "option":
            continue
        if param.metavar is None:
            param.metavar = metavar(param)
        panel = PANEL_IN.get((command, param.name)) or PANEL_OF.get(param.name)
        if panel and getattr(param, "rich_help_panel", None) is None:
            param.rich_help_panel = panel
        param._get_number_range_help_str = lambda: None
    params.sort(key=place)


def place(param: Any) -> int:
    """Where a parameter's help goes: arguments first, then the options panel by panel, in the
    order of ``PANELS`` (a command's options in any order read the same)."""
    if param.param_type_name != "option":
        return -1
    panel = getattr(param, "rich_help_panel", None)
    return list(PANELS).index(panel) if panel in PANELS else len(PANELS)


# The commands in the order of a run's life, as `tformer -h` and docs/cli.md list them.
ORDER = (
    "train", "average", "translate", "inspect-attention", "distill", "eval", "runs", "show",
    "compare", "serve", "export", "import", "tokenizer", "learn",
)  # fmt: skip


def in_order(names: list[str]) -> list[str]:
    """``names`` (of a group's commands) in ``ORDER``, any other after them as they were."""
    return sorted(names, key=lambda name: ORDER.index(name) if name in ORDER else len(ORDER))


# Two examples in each command's help (the epilog), from the toy run that `tformer train` makes.
EXAMPLES = {
    "train": ("tformer train --name toy", "tformer train --preset multi30k --max-minutes 60"),
    "average": (
        "tformer average -m small --last 3",
        "tformer average -m small -o runs/small/model.pt",
    ),
    "translate": (
        "tformer translate -m toy 'the dog sees the cat .'",
        "tformer translate -m toy -k 5 --nbest 3 --json -f input.txt -o out.jsonl",
    ),
    "inspect-attention": (
        "tformer inspect-attention -m toy 'the dog sees the cat .'",
        "tformer inspect-attention -m toy 'the cat .' --save maps.html --json -o maps.json",
    ),
    "distill": (
        "tformer distill -m teacher -o distilled && tformer train --data distilled",
        "tformer distill -m teacher --data data/toy --mix --precision int8 -o distilled",
    ),
    "eval": ("tformer eval -m toy", "tformer eval -m toy --limit 200 --json -o report.json"),
    "runs": ("tformer runs", "tformer runs --json"),
    "show": ("tformer show -m toy", "tformer show -m toy --save curves.svg"),
    "compare": ("tformer compare -m toy -m small", "tformer compare -m toy -m small --json"),
    "serve": ("tformer serve -m toy", "tformer serve -m toy --host 0.0.0.0 --port 8080"),
    "export": (
        "tformer export -m toy --to ctranslate2 -o ct2-toy",
        "tformer export -m toy --to hf -o hf-toy",
    ),
    "import": (
        "tformer import hf:Helsinki-NLP/opus-mt-de-en",
        "tformer import ./marian --name mine",
    ),
    "tokenizer train": (
        "tformer tokenizer train -o tok.json --vocab-size 1000",
        "tformer tokenizer train -o tok.json --data toy --tokenizer unigram",
    ),
    "learn start": ("tformer learn start ex", "tformer learn start ~/transformer-exercises"),
    "learn solutions": ("tformer learn solutions ex", "tformer learn check ex/solutions.py"),
    "learn check": ("tformer learn check ex", "tformer learn check ex --only attention"),
}


def examples(command: str) -> str | None:
    """The epilog of ``command``: its examples, one paragraph each."""
    lines = EXAMPLES.get(command)
    return "\n\n".join(["Examples:", *(f"$ {line}" for line in lines)]) if lines else None
