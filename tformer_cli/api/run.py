"""A trained run from Python: ``load`` it, then translate, score, trace, inspect and evaluate
with the settings ``tformer`` uses (the run's own length penalty, its precision)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from tformer_cli.api.display import (
    Attention,
    Curves,
    Evaluation,
    Hyp,
    Score,
    TraceView,
    Translation,
)
from tformer_cli.checkpoint import LoadedRun, RunConfig, load_runs
from tformer_cli.config import DecodeConfig, Range, SamplingConfig
from tformer_cli.data.batching import pad
from tformer_cli.data.corpus import toy_corpus_dir
from tformer_cli.data.tokenizer import BOS_ID, EOS_ID, encode
from tformer_cli.decode.reference import next_logprobs
from tformer_cli.decode.search import ensemble
from tformer_cli.decode.streams import file_lines, save_translations, translate_chunks
from tformer_cli.decode.trace import trace_search
from tformer_cli.decode.translate import Batching, translate_texts
from tformer_cli.device import inference
from tformer_cli.errors import SettingError, TformerError
from tformer_cli.learn.use import Use, prepare, swapped
from tformer_cli.report.attention.align import alignment_accuracy, read_aligned_corpus
from tformer_cli.report.attention.maps import inspect_pair
from tformer_cli.report.attention.view import summary_rows
from tformer_cli.report.curves import make_chart, run_series
from tformer_cli.report.eval_run import evaluate_run
from tformer_cli.report.evaluation import EvalConfig
from tformer_cli.report.pick import choose_run
from tformer_cli.report.request import EvalRequest
from tformer_cli.report.runs import read_log

PathLike = str | Path


def as_path(value: PathLike | None, argument: str) -> Path | None:
    """``value`` as a Path; anything but a str or Path is a ``TformerError`` naming ``argument``."""
    if value is None or isinstance(value, Path):
        return value
    if isinstance(value, str):
        return Path(value)
    raise TformerError(
        f"{argument}: a run folder or name (str or Path), not {type(value).__name__}"
    )


def as_texts(texts: str | Sequence[str], argument: str = "texts") -> list[str]:
    """One text or a sequence of them; anything else is a ``TformerError``."""
    items = [texts] if isinstance(texts, str) else texts
    if not isinstance(items, Sequence) or not all(isinstance(t, str) for t in items):
        raise TformerError(f"{argument}: a str or a list of str")
    return list(items)


@contextlib.contextmanager
def threads_kept() -> Iterator[None]:
    """Put torch's CPU thread count back as it was (evaluation and training change it)."""
    before = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(before)


WHOLE = {
    "beam",
    "nbest",
    "mbr",
    "min_len",
    "max_len_b",
    "seed",
    "top_k",
    "max_tokens",
    "chunk_size",
    "limit",
    "top",
}
REAL = {"alpha", "temperature", "max_len_a", "top_p", "epsilon"}
OPTIONAL = {"alpha", "top_k", "top_p", "epsilon", "limit"}
COUNTS = {"max_tokens", "chunk_size", "limit", "top"}  # of tokens, lines, pairs: from 1


def check_numbers(**values: Any) -> None:
    """A ``SettingError`` naming the first setting of the wrong type (``True`` is no beam, ``"5"``
    no number), or a count below 1; the ranges of the search's are ``DecodeConfig``'s to
    check."""
    for name, value in values.items():
        if value is None and name in OPTIONAL:
            continue
        kinds = (int,) if name in WHOLE else (int, float) if name in REAL else None
        if kinds and (isinstance(value, bool) or not isinstance(value, kinds)):
            noun = "whole number" if name in WHOLE else "number"
            raise SettingError(name, value, f"must be a {noun}")
        if name == "sample" and not isinstance(value, bool):
            raise SettingError(name, value, "must be True or False")
        if name in COUNTS and (rule := Range(1).refuses(value)) is not None:
            raise SettingError(name, value, rule)


def decode_config(
    beam: int, alpha: float, nbest: int, sample: bool,
    sampling: tuple[float, int | None, float | None, float | None], mbr: int, **rest: Any,
) -> DecodeConfig:  # fmt: skip
    """The search ``tformer translate`` runs for these options (``sampling``: temperature,
    top-k, top-p, epsilon); a sampling setting where nothing is sampled is an error."""
    draws = sample or (mbr > 0 and rest.get("mbr_from", "sample") == "sample")
    if not draws and sampling != (1.0, None, None, None):
        raise TformerError("temperature, top_k, top_p and epsilon need sample=True or mbr")
    return DecodeConfig(
        beam=1 if draws else beam, alpha=alpha, nbest=nbest, mbr=mbr,
        sampling=SamplingConfig(*sampling) if draws else None, **rest,
    ).nbest_in_beam()  # fmt: skip


class Run:
    """A loaded run (or an ensemble of runs sharing a tokenizer), ready for inference.

    ``alpha``: the GNMT length penalty of beam search, the run's own ``beam_alpha`` unless
    ``load`` was given one. ``loaded``: the ``LoadedRun`` of each model. ``use``: a learner's
    functions (``load(use=FILE)``), swapped in for tformer's while it translates and scores.
    """

    def __init__(
        self, loaded: list[LoadedRun], alpha: float | None = None, use: Use | None = None
    ) -> None:
        self.loaded = loaded
        self.alpha = length_penalty(alpha, loaded[0].config)
        self.use = use

    def _swapped(self) -> contextlib.AbstractContextManager[None]:
        """The learner's functions (``use``) in the models for a block; nothing without."""
        return swapped(self.use, [r.model for r in self.loaded])

    @property
    def path(self) -> Path:
        return self.loaded[0].run_dir

    @property
    def config(self) -> RunConfig:
        return self.loaded[0].config

    @property
    def tokenizer(self) -> Tokenizer:
        return self.loaded[0].tokenizer

    @property
    def tgt_tokenizer(self) -> Tokenizer:
        """What encodes targets: an imported model's target-side tokenizer, else ``tokenizer``."""
        return self.loaded[0].tgt_tokenizer

    def __repr__(self) -> str:
        names = ", ".join(str(r.run_dir) for r in self.loaded)
        return f"Run({names}, device={self.loaded[0].device}, alpha={self.alpha:g})"

    def _config(self, beam: int, alpha: float | None, nbest: int, **options: Any) -> DecodeConfig:
        check_numbers(beam=beam, alpha=alpha, nbest=nbest, **options)
        sampling = tuple(options.pop(k) for k in ("temperature", "top_k", "top_p", "epsilon"))
        return decode_config(
            beam, self.alpha if alpha is None else alpha, nbest, options.pop("sample"),
            sampling, options.pop("mbr"), **options,  # type: ignore[arg-type]
        )  # fmt: skip

    def translate(
        self, texts: str | Sequence[str], *, beam: int = 5, alpha: float | None = None,
        nbest: int = 1, sample: bool = False, temperature: float = 1.0, top_k: int | None = None,
        top_p: float | None = None, epsilon: float | None = None, mbr: int = 0,
        mbr_from: str = "sample", mbr_utility: str = "chrf", min_len: int = 0,
        max_len_a: float = 1.5, max_len_b: int = 10, seed: int = 0, max_tokens: int = 4096,
    ) -> list[Translation]:  # fmt: skip
        """One ``Translation`` per text, as ``tformer translate`` gives for the same options
        (``beam`` 1: greedy; ``sample``/``mbr``: drawn with ``seed``)."""
        cfg = self._config(
            beam, alpha, nbest, sample=sample, temperature=temperature, top_k=top_k,
            top_p=top_p, epsilon=epsilon, mbr=mbr, mbr_from=mbr_from, mbr_utility=mbr_utility,
            min_len=min_len, max_len_a=max_len_a, max_len_b=max_len_b, seed=seed,
        )  # fmt: skip
        check_numbers(max_tokens=max_tokens)
        items = as_texts(texts)
        with self._swapped():
            results = translate_texts(self.loaded, items, cfg, Batching(max_tokens))
        pairs = [
            (r.source, h, t)
            for r in results
            for t, h in zip(r.translations, r.hypotheses, strict=True)
        ]
        targets = [h.tokens + [EOS_ID] * h.finished for _, h, _ in pairs]
        per_token = self._forced(encode(self.tokenizer, [s for s, _, _ in pairs]), targets)
        hyps = iter(
            Hyp(
                t,
                [self.tokenizer.id_to_token(i) for i in ids],
                h.score,
                h.logprob,
                lps,
                h.finished,
            )
            for (_, h, t), ids, lps in zip(pairs, targets, per_token, strict=True)
        )
        return [Translation(r.source, [next(hyps) for _ in r.hypotheses]) for r in results]

    def translate_file(
        self, path: PathLike, out: PathLike, *, beam: int = 5, alpha: float | None = None,
        chunk_size: int = 2000, max_tokens: int = 4096,
    ) -> int:  # fmt: skip
        """Translate each line of ``path`` into the same line of ``out``, ``chunk_size`` lines
        at a time as ``tformer translate -f PATH -o OUT`` does; returns the lines translated."""
        source, target = as_path(path, "path"), as_path(out, "out")
        cfg = self._config(beam, alpha, 1, sample=False, temperature=1.0, top_k=None,
                           top_p=None, epsilon=None, mbr=0)  # fmt: skip
        check_numbers(chunk_size=chunk_size, max_tokens=max_tokens)
        chunks = translate_chunks(
            self.loaded, file_lines(source), cfg, Batching(max_tokens), chunk_size=chunk_size
        )
        return save_translations(target, chunks, "plain")

    def _forced(self, sources: list[list[int]], targets: list[list[int]]) -> list[list[float]]:
        """Teacher-forced log p(y_t | x, y_<t) of each target token (ensemble: the mean of the
        models' probabilities, as the search uses)."""
        lead = self.loaded[0]
        out: list[list[float]] = []
        with inference(lead.device, lead.dtype), self._swapped():
            for i in range(0, len(sources), 64):
                src = pad([[*s, EOS_ID] for s in sources[i : i + 64]]).to(lead.device)
                tgt = targets[i : i + 64]
                y = pad([[BOS_ID, *t[:-1]] if t else [BOS_ID] for t in tgt]).to(lead.device)
                logps = [next_logprobs(r.model(src, y).flatten(0, 1)) for r in self.loaded]
                logp = ensemble(logps).view(len(tgt), y.size(1), -1)  # (B, T, V)
                for b, t in enumerate(tgt):
                    out.append(logp[b, torch.arange(len(t)), t].tolist() if t else [])
        return out

    def score(self, sources: str | Sequence[str], targets: str | Sequence[str]) -> list[Score]:
        """Teacher-forced log-probabilities of each target (``</s>`` included) given its
        source, per token and summed."""
        src, tgt = as_texts(sources, "sources"), as_texts(targets, "targets")
        if len(src) != len(tgt):
            raise TformerError(f"targets: {len(tgt)} texts for {len(src)} sources")
        src_ids = encode(self.tokenizer, src)
        tgt_ids = [[*t, EOS_ID] for t in encode(self.tgt_tokenizer, tgt)]
        per_token = self._forced(src_ids, tgt_ids)
        return [
            Score(s, t, [self.tokenizer.id_to_token(i) for i in ids], lps)
            for s, t, ids, lps in zip(src, tgt, tgt_ids, per_token, strict=True)
        ]

    def _source(self, text: str) -> torch.Tensor:
        """One text as a source tensor (1, S), or a one-line error."""
        ids = encode(self.tokenizer, as_texts(text, "text"))[0]
        limit = self.loaded[0].model.cfg.max_positions
        if not ids:
            raise TformerError("text: nothing to translate: the text is empty")
        if len(ids) + 1 > limit:
            raise TformerError(f"text: {len(ids) + 1} tokens; this model reads at most {limit}")
        return torch.tensor([[*ids, EOS_ID]], device=self.loaded[0].device)

    def trace(
        self, text: str, *, beam: int = 5, top: int = 5, alpha: float | None = None
    ) -> TraceView:
        """The step-through search of one text (``decode.trace``): every step's hypotheses,
        their ``top`` next tokens (kept, pruned or finished), their cross-attention rows."""
        check_numbers(top=top)
        cfg = self._config(beam, alpha, beam, sample=False, temperature=1.0, top_k=None,
                           top_p=None, epsilon=None, mbr=0)  # fmt: skip
        lead = self.loaded[0]
        with inference(lead.device, lead.dtype):
            traced = trace_search(
                [r.model for r in self.loaded], self._source(text), cfg, top, lead.compile
            )
        return TraceView(traced, self.tokenizer, text)

    def attention(
        self, text: str, *, target: str | None = None, beam: int = 1, align: bool = True
    ) -> Attention:
        """Every attention map of ``text`` and its translation (``beam``; or ``target``,
        teacher-forced), as ``tformer inspect-attention`` computes them, with its summary."""
        lead, src = self.loaded[0], self._source(text)
        src_ids = src[0, :-1].tolist()
        if target is None:
            best = self.translate(text, beam=beam)[0].nbest[0]
            targets = [self.tokenizer.token_to_id(p) for p in best.tokens]  # </s> included
        else:
            targets = [*encode(self.tgt_tokenizer, as_texts(target, "target"))[0], EOS_ID]
        with inference(lead.device, lead.dtype):
            maps = inspect_pair(lead.model, self.tokenizer, text, src_ids, targets)
            score, note = None, ""
            if align and self.config.train.data == "toy":
                pairs, links = read_aligned_corpus(toy_corpus_dir(), "test", 200)
                score = alignment_accuracy(lead.model, self.tokenizer, pairs, links)
                score = score if score.words else None
        if score is not None and (best_head := score.best()) is not None:
            note = f"best aligned head: layer {best_head[0] + 1} head {best_head[1] + 1}"
        return Attention(maps, summary_rows(maps, "cross", score), note)

    def evaluate(
        self, *, data: str | None = None, split: str = "test", limit: int | None = None,
        beam: int = 5, alpha: float | None = None, seed: int = 1234, threads: int = 0,
        save: bool = False, json_path: PathLike | None = None, hyp_path: PathLike | None = None,
        quiet: bool = True,
    ) -> Evaluation:  # fmt: skip
        """``tformer eval`` of the (first) run: BLEU/chrF, teacher-forced metrics and the
        exposure-bias report. Nothing is written unless asked: ``save`` keeps the result in
        the run folder (as the command does), ``json_path``/``hyp_path`` write those files."""
        check_numbers(beam=beam, alpha=alpha, limit=limit, seed=seed)
        lead = self.loaded[0]
        cfg = EvalConfig(
            DecodeConfig(beam=beam, alpha=self.alpha if alpha is None else alpha), seed=seed
        )
        request = EvalRequest(
            data=data, split=split, limit=limit, config=cfg, device=str(lead.device),
            precision=precision_of(lead), threads=threads, compile=lead.compile,
        )  # fmt: skip
        with threads_kept():
            done = evaluate_run(
                lead.run_dir, request, keep=save, json_path=as_path(json_path, "json_path"),
                hyp_path=as_path(hyp_path, "hyp_path"), quiet=quiet,
            )  # fmt: skip
        return Evaluation.of(done.report)

    def history(self) -> list[dict[str, Any]]:
        """The run's ``log.jsonl`` as records (training, validation and end records)."""
        return read_log(self.path)

    def curves(self, x: str = "updates") -> Curves:
        """The run's training curves (``tformer show``), shown as SVG in a notebook."""
        return Curves(make_chart([(self.path.name, run_series(self.history()))], x, self.path.name))


def precision_of(run: LoadedRun) -> str:
    """The ``--precision`` name of a loaded run's dtype."""
    return {torch.bfloat16: "bf16", torch.qint8: "int8"}.get(run.dtype, "fp32")  # type: ignore[arg-type]


def length_penalty(alpha: float | None, run: RunConfig | Path | None) -> float:
    """The GNMT alpha of beam search: ``alpha`` if given, else the run's own ``beam_alpha``
    (``run``: its config, or its folder or name, default the newest run). The one rule that
    the commands and the API follow."""
    if alpha is not None:
        return alpha
    config = run if isinstance(run, RunConfig) else RunConfig.load(choose_run(run))
    return config.train.beam_alpha


def own_precision(run: Path | None) -> str:
    """The precision a run (default: the newest) was trained with: what every command and
    ``load`` decode it with unless told otherwise."""
    return RunConfig.load(choose_run(run)).train.precision


def load(
    run: PathLike | Sequence[PathLike] | None = None, *, device: str = "auto",
    precision: str | None = None, compile: str = "auto", alpha: float | None = None,
    use: PathLike | dict[str, Any] | None = None,
) -> Run:  # fmt: skip
    """A run ready to translate: a folder or a name under ``runs/`` (default: the newest run);
    several runs sharing a tokenizer load as an ensemble. ``precision``: fp32, bf16, auto or
    int8 (CPU); default the (first) run's own, as ``tformer translate``. ``alpha``: the length
    penalty, default the run's ``beam_alpha``. ``use``: a ``tformer learn`` exercises file (or
    its folder, or a notebook's ``globals()``), checked; each exercise it passes replaces
    tformer's function while the run translates, on the eager step (``compile`` off):
    ``Run.use.line()`` says which. Changes no
    process-wide setting (see ``tformer_cli.setup``)."""
    many = list(run) if isinstance(run, (list, tuple)) else [run]
    paths = [as_path(r, "run") for r in many]
    for name, value in (("device", device), ("compile", compile)):
        if not isinstance(value, str):
            raise TformerError(f"{name}: a str, not {type(value).__name__}")
    check_numbers(alpha=alpha)
    if alpha is not None and (rule := Range(0).refuses(alpha)) is not None:
        raise SettingError("alpha", alpha, rule)
    models = [choose_run(p) for p in paths or [None]]
    precision = precision or own_precision(models[0])
    learner = None
    if isinstance(use, dict) or (use := as_path(use, "use")) is not None:
        learner = prepare(use)
    loaded = load_runs(models, device, precision, "off" if learner else compile)
    return Run(loaded, alpha, learner)
