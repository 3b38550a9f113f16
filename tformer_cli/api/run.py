"""A trained run from Python: ``load`` it, then translate, score, trace, inspect and evaluate
with the settings ``tformer`` uses (the run's own length penalty, its precision)."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar, get_type_hints

import torch
from tokenizers import Tokenizer

from tformer_cli.api.display import Attention, Curves, Evaluated, Hyp, Score, TraceView, Translated
from tformer_cli.checkpoint import LoadedRun, RunConfig, load_runs
from tformer_cli.config import (
    NOT_EVALUATED,
    AttentionOptions,
    DecodeOptions,
    EvalOptions,
    Range,
    TraceOptions,
)
from tformer_cli.config.fields import refused_kind
from tformer_cli.data.batching import pad
from tformer_cli.data.tokenizer import BOS_ID, EOS_ID, encode
from tformer_cli.decode.reference import next_logprobs
from tformer_cli.decode.search import ensemble
from tformer_cli.decode.streams import file_lines, save_translations, translate_chunks
from tformer_cli.decode.trace import trace_search
from tformer_cli.decode.translate import Batching, translate_texts
from tformer_cli.device import inference
from tformer_cli.errors import SettingError, TformerError
from tformer_cli.learn.use import Use, prepare, swapped
from tformer_cli.report.attention.maps import inspect_pair
from tformer_cli.report.attention.view import AttentionRequest, alignment, summary_rows
from tformer_cli.report.curves import make_chart, run_series
from tformer_cli.report.eval_run import evaluate_run
from tformer_cli.report.evaluation import EvalConfig
from tformer_cli.report.pick import choose_run
from tformer_cli.report.request import EvalRequest
from tformer_cli.report.runs import read_log

PathLike = str | Path
# the panels inspect-attention draws; Run.attention returns every map (Attention.weights)
SELECTION = ("layer", "head")


def as_path(value: PathLike | None, argument: str) -> Path | None:
    """``value`` as a Path; anything but a str or Path is an error naming ``argument``."""
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


S = TypeVar("S")
F = TypeVar("F", bound=Callable[..., Any])


def settings(cls: type[S], given: dict[str, Any], skip: Collection[str] = ()) -> S:
    """The settings object ``cls`` of the keywords ``given``; an unknown keyword is an error."""
    names = [f.name for f in dataclasses.fields(cls) if f.name not in skip]  # type: ignore[arg-type]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise TformerError(f"{unknown[0]}: no such keyword (use {', '.join(names)})")
    return cls(**given)


def takes(cls: type, skip: Collection[str] = ()) -> Callable[[F], F]:
    """Show the fields of ``cls`` (``skip`` aside) as the keywords of a method's ``**options``
    (for ``help()`` and a notebook's completion)."""

    def attach(method: F) -> F:
        own = inspect.signature(method)
        kept = [p for p in own.parameters.values() if p.kind is not p.VAR_KEYWORD]
        hints = get_type_hints(cls)
        keywords = [
            inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                              annotation=hints[f.name])
            for f in dataclasses.fields(cls) if f.name not in skip
        ]  # fmt: skip
        method.__signature__ = own.replace(parameters=[*kept, *keywords])  # type: ignore[attr-defined]
        return method

    return attach


def count(name: str, value: Any) -> int:
    """``value`` if it is a whole number from 1, else a ``SettingError`` naming ``name``."""
    rule = refused_kind(int, value) or Range(1).refuses(value)
    if rule is not None:
        raise SettingError(name, value, rule)
    return value


def eval_request(options: EvalOptions, alpha: float, **where: Any) -> EvalRequest:
    """The evaluation ``options`` ask for, with the length penalty ``alpha``, run where
    ``where`` says (``EvalRequest``'s device, precision, threads...)."""
    config = EvalConfig(options.search(alpha), seed=options.seed)
    return EvalRequest(**options.data_fields(), config=config, **where)


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
        self.alpha = run_alpha(alpha, loaded[0].config)
        self.use = use

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

    def _alpha(self, options: DecodeOptions | TraceOptions) -> float:
        return self.alpha if options.alpha is None else options.alpha

    def _pieces(self, ids: list[int]) -> list[str]:
        return [self.tokenizer.id_to_token(i) for i in ids]

    @takes(DecodeOptions)
    def translate(
        self, texts: str | Sequence[str], *, max_tokens: int = 4096, **options: Any
    ) -> list[Translated]:
        """One ``Translated`` per text, as ``tformer translate`` gives for the same options
        (``DecodeOptions``: ``beam`` 1 is greedy; ``sample``/``mbr``: drawn with ``seed``)."""
        asked = settings(DecodeOptions, options)
        cfg = asked.search(self._alpha(asked))
        batching = Batching(count("max_tokens", max_tokens))
        items = as_texts(texts)
        with swapped(self.use):
            results = translate_texts(self.loaded, items, cfg, batching)
        pairs = [
            (r.source, h, t)
            for r in results
            for t, h in zip(r.translations, r.hypotheses, strict=True)
        ]
        targets = [h.tokens + [EOS_ID] * h.finished for _, h, _ in pairs]
        per_token = self._forced(encode(self.tokenizer, [s for s, _, _ in pairs]), targets)
        hyps = iter(
            Hyp(t, self._pieces(ids), h.score, h.logprob, lps, h.finished)
            for (_, h, t), ids, lps in zip(pairs, targets, per_token, strict=True)
        )
        return [Translated(r.source, [next(hyps) for _ in r.hypotheses]) for r in results]

    @takes(DecodeOptions)
    def translate_file(
        self, path: PathLike, out: PathLike, *, chunk_size: int = 2000, max_tokens: int = 4096,
        **options: Any,
    ) -> int:  # fmt: skip
        """Translate each line of ``path`` into ``out`` as ``tformer translate -f PATH -o OUT``
        does (the best hypothesis of each); returns the lines translated."""
        source, target = as_path(path, "path"), as_path(out, "out")
        asked = settings(DecodeOptions, options)
        batching = Batching(count("max_tokens", max_tokens))
        chunks = translate_chunks(
            self.loaded, file_lines(source), asked.search(self._alpha(asked)), batching,
            chunk_size=count("chunk_size", chunk_size),
        )  # fmt: skip
        return save_translations(target, chunks, "plain")

    def _forced(self, sources: list[list[int]], targets: list[list[int]]) -> list[list[float]]:
        """Teacher-forced log p(y_t | x, y_<t) of each target token (an ensemble's mean)."""
        lead = self.loaded[0]
        out: list[list[float]] = []
        with inference(lead.device, lead.dtype), swapped(self.use):
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
            Score(s, t, self._pieces(ids), lps)
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

    @takes(TraceOptions)
    def trace(self, text: str, **options: Any) -> TraceView:
        """The step-through search of one text: every step's hypotheses, their ``top`` next
        tokens (kept, pruned or finished), their cross-attention rows."""
        asked = settings(TraceOptions, options)
        lead = self.loaded[0]
        with inference(lead.device, lead.dtype):
            traced = trace_search(
                [r.model for r in self.loaded], self._source(text),
                asked.search(self._alpha(asked)), asked.top, lead.compile,
            )  # fmt: skip
        return TraceView(traced, self.tokenizer, text)

    @takes(AttentionOptions, skip=SELECTION)
    def attention(self, text: str, *, target: str | None = None, **options: Any) -> Attention:
        """Every attention map of ``text`` and its translation (``beam``; or ``target``,
        teacher-forced), with the per-head summary of ``kind`` that ``tformer inspect-attention``
        prints (``align``: cross-attention's alignment accuracy on ``align_sentences`` toy test
        pairs, a run trained on toy's) and its note."""
        asked = settings(AttentionOptions, options, skip=SELECTION)
        lead, src = self.loaded[0], self._source(text)
        src_ids = src[0, :-1].tolist()
        if target is None:
            best = self.translate(text, beam=asked.beam)[0].nbest[0]
            targets = [self.tokenizer.token_to_id(p) for p in best.tokens]  # </s> included
        else:
            targets = [*encode(self.tgt_tokenizer, as_texts(target, "target"))[0], EOS_ID]
        with inference(lead.device, lead.dtype), swapped(self.use):
            maps = inspect_pair(lead.model, self.tokenizer, text, src_ids, targets)
        chosen = {f.name: getattr(asked, f.name) for f in dataclasses.fields(asked)}
        score, note = alignment(lead, AttentionRequest(**chosen))
        return Attention(maps, summary_rows(maps, asked.kind, score), note)

    @takes(EvalOptions, skip=NOT_EVALUATED)
    def evaluate(
        self, *, threads: int = 0, save: bool = False, json_path: PathLike | None = None,
        hyp_path: PathLike | None = None, quiet: bool = True, **options: Any,
    ) -> Evaluated:  # fmt: skip
        """``tformer eval`` of the (first) run (``EvalOptions``): BLEU/chrF, teacher-forced
        metrics and the exposure-bias report, with the learner's functions of ``load(use=...)``.
        Nothing is written unless asked: ``save`` keeps the result in the run folder (as the
        command does; not with ``use``), ``json_path``/``hyp_path`` write those files."""
        asked = settings(EvalOptions, options, skip=NOT_EVALUATED)
        if save and self.use is not None:
            raise TformerError("save: a result with your functions is not the run's to keep")
        lead = self.loaded[0]
        request = eval_request(
            asked, self._alpha(asked), device=str(lead.device), precision=precision_of(lead),
            threads=threads, compile=lead.compile,
        )  # fmt: skip
        with threads_kept(), swapped(self.use):
            done = evaluate_run(
                lead.run_dir, request, keep=save, json_path=as_path(json_path, "json_path"),
                hyp_path=as_path(hyp_path, "hyp_path"), quiet=quiet,
            )  # fmt: skip
        return Evaluated.of(done.report)

    def history(self) -> list[dict[str, Any]]:
        """The run's ``log.jsonl`` as records (training, validation and end records)."""
        return read_log(self.path)

    def curves(self, x: str = "updates") -> Curves:
        """The run's training curves (``tformer show``), shown as SVG in a notebook."""
        return Curves(make_chart([(self.path.name, run_series(self.history()))], x, self.path.name))


def precision_of(run: LoadedRun) -> str:
    """The ``--precision`` name of a loaded run's dtype."""
    return {torch.bfloat16: "bf16", torch.qint8: "int8"}.get(run.dtype, "fp32")  # type: ignore[arg-type]


def run_alpha(alpha: float | None, run: RunConfig | Path | None) -> float:
    """``alpha`` if given, else the run's own ``beam_alpha`` (``run``: its config, folder or
    name; default the newest run)."""
    if alpha is not None:
        return alpha
    config = run if isinstance(run, RunConfig) else RunConfig.load(choose_run(run))
    return config.train.beam_alpha


def own_precision(run: Path | None) -> str:
    """The precision a run (default: the newest) was trained with, which decoding uses."""
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
    ``Run.use.line()`` says which. Changes no process-wide setting (see ``tformer_cli.setup``)."""
    many = list(run) if isinstance(run, (list, tuple)) else [run]
    paths = [as_path(r, "run") for r in many]
    for name, value in (("device", device), ("compile", compile)):
        if not isinstance(value, str):
            raise TformerError(f"{name}: a str, not {type(value).__name__}")
    TraceOptions(alpha=alpha)  # a length penalty: its type and values
    models = [choose_run(p) for p in paths or [None]]
    precision = precision or own_precision(models[0])
    learner = None
    if isinstance(use, dict) or (use := as_path(use, "use")) is not None:
        learner = prepare(use)
    loaded = load_runs(models, device, precision, "off" if learner else compile)
    return Run(loaded, alpha, learner)
