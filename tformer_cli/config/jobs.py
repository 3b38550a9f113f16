"""The settings a user gives the other jobs, declared once for every face: an evaluation, a
teacher's translations of a corpus, the attention maps of a sentence, and the server."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tformer_cli.config.decode import MAX_BEAM, DecodeConfig, DecodeOptions
from tformer_cli.config.fields import Checked, OneOf, Pattern, Range, same_as, setting, values_of

EVAL_SPLITS = ("train", "valid", "test", "all")  # a corpus's splits, or every pair of it
# The search's settings that an evaluation has not: it scores the best hypothesis.
NOT_EVALUATED = ("nbest",)
# CTranslate2's weight types (tformer export --quantization)
QUANTIZATIONS = ("float32", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16",
                 "float16", "bfloat16")  # fmt: skip


@dataclass(frozen=True)
class EvalOptions(DecodeOptions):
    """What an evaluation (``tformer eval``, ``compare``, ``Run.evaluate``) reads, and the beam
    pass's search (greedy always runs too; its n-best is one hypothesis)."""

    seed: int = setting(
        1234,
        "Seed of the prefix-noise draws and of the samples.",
        values=values_of(DecodeConfig, "seed"),
    )
    data: str | None = setting(
        None, "Corpus (as for train). Default: the data the run was trained on."
    )
    src: str | None = setting(None, "Source language. Default: the run's.")
    tgt: str | None = setting(None, "Target language. Default: the run's.")
    src_file: Path | None = setting(
        None,
        "Plain source file (e.g. newstest2014.de): with --tgt-file, score every pair of the"
        " two files, in order, instead of --data.",
        path=True,
    )
    tgt_file: Path | None = setting(
        None, "Plain target file, line by line with --src-file.", path=True
    )
    split: str = setting(
        "test",
        "train, valid, test, or all: every pair of --data, in order.",
        values=OneOf(EVAL_SPLITS),
    )
    limit: int | None = setting(None, "Evaluate only the first N sentence pairs.", values=Range(1))

    def data_fields(self) -> dict[str, Any]:
        """The data and split as ``EvalRequest`` names them."""
        return {
            "data": self.data, "src_lang": self.src, "tgt_lang": self.tgt,
            "src_file": self.src_file, "tgt_file": self.tgt_file, "split": self.split,
            "limit": self.limit,
        }  # fmt: skip


@dataclass(frozen=True)
class DistillOptions(Checked):
    """What ``tformer distill`` translates (the training split of ``data``, default the
    teacher's own corpus carved with its seed) and how."""

    data: str | None = same_as(
        EvalOptions, "data", "Corpus (as for train). Default: the data the teacher was trained on."
    )
    src: str | None = same_as(EvalOptions, "src")
    tgt: str | None = same_as(EvalOptions, "tgt")
    beam: int = same_as(DecodeOptions, "beam")
    alpha: float | None = same_as(
        DecodeOptions,
        "alpha",
        "GNMT length penalty, as for translate. Default: the teacher's --beam-alpha.",
    )
    mix: bool = setting(False, "Keep the original training pairs too, after the teacher's.")
    limit: int | None = setting(None, "Distill only the first N training pairs.", values=Range(1))
    chunk_size: int = setting(
        2000,
        "Pairs translated (sorted by length into batches) and written at a time: a stopped"
        " run resumes after the last chunk written.",
        values=Range(1, 1_000_000),
    )
    max_tokens: int = setting(4096, "Source tokens per batch.", values=Range(1))
    force: bool = setting(False, "Distill again into a folder that holds a finished distillation.")

    def search(self, alpha: float) -> DecodeConfig:
        """The teacher's beam search, with the length penalty ``alpha`` (``self.alpha`` or the
        teacher's own)."""
        return DecodeConfig(beam=self.beam, alpha=alpha)


def numbered(*words: str) -> Pattern:
    """The values of ``layer``/``head``: a number from 1 or one of ``words`` (a number past the
    model's layers or heads is for the run to say)."""
    either = f"must be a number from 1, {' or '.join(words)}"
    return Pattern(rf"[1-9][0-9]*|{'|'.join(words)}", either)


@dataclass(frozen=True)
class AttentionOptions(Checked):
    """What `tformer inspect-attention` shows of a sentence and of the translation ``beam``
    finds (``align``: for a run trained on toy, each head's alignment accuracy)."""

    kind: str = setting(
        "cross",
        "cross (target -> source), encoder or decoder self-attention.",
        values=OneOf(("cross", "encoder", "decoder")),
        metavar="KIND",  # beside --align/--no-align, not its choices
    )
    layer: str = setting(
        "last",
        "Layer number (from 1), last or all.",
        values=numbered("last", "all"),
        metavar="N|last|all",
    )
    head: str = setting(
        "all",
        "Head number (from 1), mean or all.",
        values=numbered("mean", "all"),
        metavar="N|mean|all",
    )
    beam: int = setting(
        1,
        "Beam size (1 = greedy); the best is shown.",
        flags=("--beam", "-k"),
        values=Range(1, MAX_BEAM),
    )
    align: bool = setting(True, "Score cross-attention heads against the toy gold alignments.")
    align_sentences: int = setting(
        200, "Toy test sentences for the alignment accuracy.", values=Range(1)
    )


@dataclass(frozen=True)
class Limits(Checked):
    """What one request to the server may ask for; past them it gets a 4xx answer (503 past
    ``timeout``)."""

    max_chars: int = setting(1000, "Characters per text.", values=Range(1))
    max_texts: int = setting(64, "Texts per request.", values=Range(1))
    max_body: int = setting(1 << 20, "Bytes per request body.", values=Range(1))
    max_beam: int = setting(16, "Largest beam (and n-best).", values=Range(1, MAX_BEAM))
    timeout: float = setting(
        30.0, "Seconds a request may wait and run (then 503).", values=Range(0.001)
    )


@dataclass(frozen=True)
class ServeOptions(Limits):
    """``tformer serve``: where it listens, how requests are gathered into a decoding batch
    (``max_tokens`` source tokens, waiting ``wait_ms``), and the ``Limits`` of one request."""

    host: str = setting("127.0.0.1", "Address to listen on (0.0.0.0: all).", metavar="HOST")
    port: int = setting(8000, "Port to listen on.", values=Range(1, 65535))
    max_tokens: int = setting(
        4096, "Source tokens gathered into one decoding batch.", values=Range(1)
    )
    wait_ms: float = setting(5.0, "How long a batch waits for more requests (ms).", values=Range(0))

    @property
    def limits(self) -> Limits:
        """The per-request limits alone."""
        return Limits(self.max_chars, self.max_texts, self.max_body, self.max_beam, self.timeout)
