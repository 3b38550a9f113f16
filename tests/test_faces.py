"""Each job's settings object is every face's: the command line's options, the Python API's
keywords and the server's request bodies have its fields, with its defaults. A face that leaves
a field out, or adds one of its own, names it here with the reason."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest
import typer.main

from tformer_cli.api.run import Run
from tformer_cli.api.training import compare
from tformer_cli.cli import app
from tformer_cli.config import (
    AttentionOptions,
    DecodeOptions,
    EvalOptions,
    Limits,
    ServeOptions,
    TraceOptions,
)

COMMANDS = typer.main.get_command(app).commands  # type: ignore[attr-defined]


def fields(settings: type, without: dict[str, str] | None = None) -> dict[str, Any]:
    """The fields of ``settings`` and their defaults, those a face leaves out aside."""
    return {
        f.name: f.default for f in dataclasses.fields(settings) if f.name not in (without or {})
    }


def options(command: str) -> dict[str, Any]:
    """A command's parameters (options and arguments) and their defaults."""
    return {p.name: p.default for p in COMMANDS[command].params if p.name != "help"}


def keywords(function: Any, own: dict[str, str]) -> dict[str, Any]:
    """A Python function's keywords and their defaults, its ``own`` ones (not settings) aside."""
    skipped = {"self", *own}
    parameters = inspect.signature(function).parameters.values()
    return {p.name: p.default for p in parameters if p.name not in skipped}


def body(model: Any, own: dict[str, str]) -> dict[str, Any]:
    """A request body's fields and their defaults (its JSON schema), its ``own`` ones aside."""
    properties = model.model_json_schema()["properties"]
    return {name: p.get("default") for name, p in properties.items() if name not in own}


# ---------------------------------------------------------------------------- decode
TRANSLATE_OWN = {"max_tokens": "a batch's size: where it runs, not what it finds",
                 "texts": "what to translate"}  # fmt: skip
NOT_SERVED = {
    name: "the server decodes beam search only: draws, MBR and length limits are the commands'"
    for name in ("sample", "temperature", "top_k", "top_p", "epsilon", "seed", "mbr", "mbr_from",
                 "mbr_utility", "min_len", "max_len_a", "max_len_b")
}  # fmt: skip


def test_translate_s_options_are_the_decode_options_fields():
    from tformer_cli.cli.decode import Translate

    assert options("translate") == fields(Translate)
    assert fields(Translate).items() >= fields(DecodeOptions).items()


@pytest.mark.parametrize("method", [Run.translate, Run.translate_file])
def test_run_translate_takes_the_decode_options_fields(method):
    own = {**TRANSLATE_OWN, "path": "the file read", "out": "the file written",
           "chunk_size": "lines at a time: where it runs"}  # fmt: skip
    assert keywords(method, own) == fields(DecodeOptions)


def serve_bodies(alpha: float = 0.6) -> tuple[Any, Any, Any]:
    serve = pytest.importorskip("tformer_cli.serve", exc_type=ImportError)
    return serve.request_models(Limits(), alpha)


def test_the_translate_request_has_the_decode_options_fields_it_serves():
    translate, _, _ = serve_bodies(alpha=0.9)
    served = fields(DecodeOptions, NOT_SERVED)
    assert body(translate, {"texts": "what to translate"}) == {**served, "alpha": 0.9}


# ---------------------------------------------------------------------------- trace
def test_a_trace_is_the_same_in_python_and_the_server():
    """Beam 5, top 5 (the server's were 3 and 3)."""
    _, _, trace = serve_bodies(alpha=0.9)
    assert keywords(Run.trace, {"text": "what to trace"}) == fields(TraceOptions)
    assert body(trace, {"text": "what to trace"}) == {**fields(TraceOptions), "alpha": 0.9}
    assert fields(TraceOptions)["beam"] == fields(TraceOptions)["top"] == 5


# ---------------------------------------------------------------------------- eval and compare
NOT_EVALUATED = {"nbest": "an evaluation scores the best hypothesis of its search"}
EVAL_OWN = {"threads": "where it runs", "save": "what it writes", "json_path": "what it writes",
            "hyp_path": "what it writes", "quiet": "what it prints",
            "runs": "the runs compared"}  # fmt: skip


@pytest.mark.parametrize("command", ["eval", "compare"])
def test_eval_and_compare_take_the_eval_options_fields(command):
    from tformer_cli.cli.evaluate import Compare, Evaluate

    settings = {"eval": Evaluate, "compare": Compare}[command]
    assert options(command) == fields(settings, NOT_EVALUATED)
    assert fields(settings).items() >= fields(EvalOptions).items()


@pytest.mark.parametrize("function", [Run.evaluate, compare])
def test_python_evaluates_with_the_eval_options_fields(function):
    assert keywords(function, EVAL_OWN) == fields(EvalOptions, NOT_EVALUATED)


# ---------------------------------------------------------------------------- distill
def test_distill_s_options_are_the_distill_options_fields():
    from tformer_cli.cli.decode import Distill
    from tformer_cli.config import DistillOptions

    required = {"output": dataclasses.MISSING}
    assert options("distill") == {**fields(Distill), "output": None}
    assert fields(Distill).items() >= {**fields(DistillOptions), **required}.items()


# ---------------------------------------------------------------------------- attention
SELECTED = {name: "Run.attention returns every map (Attention.weights); a notebook selects"
            for name in ("layer", "head")}  # fmt: skip
ATTENTION_SERVED = {
    **SELECTED,
    "kind": "the server answers every kind's maps, and the summary of cross-attention",
    "align": "the server answers the maps; alignment accuracy is the command's",
    "align_sentences": "the server answers the maps; alignment accuracy is the command's",
}


def test_inspect_attention_python_and_the_server_take_the_attention_options_fields():
    from tformer_cli.cli.decode import InspectAttention

    required = {"text": dataclasses.MISSING}
    assert options("inspect-attention") == {**fields(InspectAttention), "text": None}
    assert fields(InspectAttention).items() >= {**fields(AttentionOptions), **required}.items()
    own = {"text": "what to translate", "target": "a translation to read instead"}
    assert keywords(Run.attention, own) == fields(AttentionOptions, SELECTED)
    _, attention, _ = serve_bodies(alpha=0.9)
    server_own = {"text": "what to translate", "alpha": "the length penalty of its search"}
    assert body(attention, server_own) == fields(AttentionOptions, ATTENTION_SERVED)


# ---------------------------------------------------------------------------- serve
def test_serve_s_options_are_the_serve_options_fields():
    from tformer_cli.cli.tools import Serve

    assert options("serve") == fields(Serve)
    assert fields(Serve).items() >= fields(ServeOptions).items()
    assert fields(ServeOptions).items() >= fields(Limits).items()  # the server's own limits
