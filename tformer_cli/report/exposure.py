"""Exposure-bias metrics (sections 3-6 of docs/exposure_bias.md), over token ids.

Each teacher-forced (TF) pass is one batched decoder forward (``forced_pass``) on the gold
prefix (clean), on the clean pass's own predictions (self-injected), or on gold with random
substitutions (prefix noise); targets are always ``y* </s>``. Target positions ``t`` are
1-based and include ``</s>``; a metric with no defined value is ``None``, printed ``n/a``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sacrebleu
import torch
import torch.nn.functional as F
from rich.console import Group
from rich.table import Table
from rich.text import Text
from torch import nn

from tformer_cli.data.batching import pad, token_batches
from tformer_cli.data.tokenizer import BOS_ID, EOS_ID, PAD_ID

N_SPECIAL = 4  # ids 0..3: <pad> <unk> <s> </s>, never drawn as prefix noise
BUCKETS = ((1, 5), (6, 10), (11, 20), (21, 40), (41, None))  # target positions, 1-based
SPARK = "▁▂▃▄▅▆▇█"


CAVEAT = (
    "Caveat: where a source has many valid translations, a token that differs from the reference "
    "may be a legitimate alternative, and part of excess_error is then divergence, not "
    "accumulated error (Arora et al. avoid this with an oracle model). The toy corpus, with "
    "exactly one correct translation per source, isolates the effect."
)


def ratio(num: float | None, den: float | None) -> float | None:
    """``num / den``, or ``None`` where either is undefined or the denominator is 0."""
    return None if num is None or not den else num / den


def diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def fmt(value: float | None, spec: str = ".2f") -> str:
    """A number as the report prints it; ``None`` (undefined) is ``n/a``, never 0."""
    return "n/a" if value is None else f"{value:{spec}}"


def pct(value: float | None, spec: str = ".2f") -> str:
    """A share (0..1) printed as a percentage; ``None`` is ``n/a``."""
    return "n/a" if value is None else f"{100 * value:{spec}}%"


def points(value: float | None) -> str:
    """A difference of two shares in percentage points, signed: ``+3.42 pp``."""
    return "n/a" if value is None else f"{100 * value:+.2f} pp"


def table(
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    caption: str = "",
    labels: bool = True,
) -> Group:
    """A report section: a bold title, a table of right-aligned numbers, the caption."""
    t = Table()
    for i, name in enumerate(columns):
        t.add_column(name, justify="left" if labels and i == 0 else "right")
    for row in rows:
        t.add_row(*row)
    return Group(Text(""), Text(title, style="bold"), t, *([Text(caption)] if caption else []))


# ---------------------------------------------------------------------------- TF passes
@dataclass(frozen=True)
class ForcedPass:
    """One TF pass: each sentence's prediction at each position of ``y* </s>``, the gold NLL."""

    preds: list[list[int]]
    nll: float
    tokens: int


@torch.inference_mode()
def forced_pass(
    model: nn.Module,
    src: Sequence[Sequence[int]],
    inputs: Sequence[Sequence[int]],
    gold: Sequence[Sequence[int]],
    max_tokens: int = 4096,
    score: bool = True,
) -> ForcedPass:
    """Predict each position of ``gold[i]`` reading ``inputs[i]`` given ``src[i]`` (``</s>``
    added), batched by length, in input order; with ``score``, sum the gold tokens' NLL. ``a_t``
    is the argmax over what decoding can emit (not ``<pad>``, ``<s>``): after a gold prefix,
    greedy decoding's next token."""
    device = next(model.parameters()).device
    lengths = [max(len(s) + 1, len(g)) for s, g in zip(src, gold, strict=True)]
    preds: list[list[int]] = [[] for _ in src]
    nll, n = 0.0, 0
    for idx in token_batches(lengths, max_tokens):
        x = pad([[*src[i], EOS_ID] for i in idx]).to(device)  # (B, S)
        y_in = pad([inputs[i] for i in idx]).to(device)  # (B, T)
        y_out = pad([gold[i] for i in idx]).to(device)  # (B, T)
        logits = model(x, y_in).float()  # (B, T, V)
        if score:
            flat = logits.flatten(0, 1), y_out.flatten()  # (B*T, V), (B*T)
            nll += float(F.cross_entropy(*flat, ignore_index=PAD_ID, reduction="sum"))
        n += int((y_out != PAD_ID).sum())
        logits[..., [PAD_ID, BOS_ID]] = float("-inf")
        best = logits.argmax(dim=-1).tolist()  # (B, T)
        for row, i in enumerate(idx):
            preds[i] = best[row][: len(gold[i])]
    return ForcedPass(preds, nll, n)


def gold_io(tgt: Sequence[Sequence[int]]) -> tuple[list[list[int]], list[list[int]]]:
    """Decoder inputs ``<s> y*`` and targets ``y* </s>`` of each reference (as ``make_batch``)."""
    return [[BOS_ID, *t] for t in tgt], [[*t, EOS_ID] for t in tgt]


def self_injected_inputs(clean_preds: Sequence[Sequence[int]]) -> list[list[int]]:
    """``<s> a_1 .. a_n``: each gold input the clean pass got wrong replaced by its prediction."""
    return [[BOS_ID, *a[:-1]] for a in clean_preds]


def tf_argmax_tokens(clean_preds: Sequence[Sequence[int]]) -> list[list[int]]:
    """The TF-argmax sequence for ``tf_bleu``: one prediction per reference position, every
    ``</s>`` removed (one predicted mid-sentence is a wrong token, not the end)."""
    return [[tok for tok in a if tok != EOS_ID] for a in clean_preds]


# ---------------------------------------------------------------------------- section 4
@dataclass(frozen=True)
class Bucket:
    """The two error rates over the counted positions ``first .. last`` (``None``: no end)."""

    first: int
    last: int | None
    positions: int
    err_clean: float | None
    err_self: float | None

    @property
    def label(self) -> str:
        return f"{self.first}-{self.last}" if self.last is not None else f"{self.first}+"


@dataclass(frozen=True)
class Accumulation:
    """Error rates strictly after each sentence's first clean-pass error (section 4)."""

    err_clean: float | None
    err_self: float | None
    excess_error: float | None
    excess_error_pct: float | None
    positions: int  # positions counted (after the first error)
    sentences_with_error: int
    sentences: int
    buckets: list[Bucket]


def bucket_of(t: int) -> int:
    """Index into ``BUCKETS`` of the 1-based target position ``t``."""
    return next(k for k, (_, last) in enumerate(BUCKETS) if last is None or t <= last)


def accumulation(
    gold: Sequence[Sequence[int]],
    clean_preds: Sequence[Sequence[int]],
    self_preds: Sequence[Sequence[int]],
) -> Accumulation:
    """Section 4: error rates after each sentence's first clean-pass error, in all and by bucket."""
    counts = [[0, 0, 0] for _ in BUCKETS]  # per bucket: positions, clean errors, self errors
    with_error = 0
    for g, a, b in zip(gold, clean_preds, self_preds, strict=True):
        wrong = [x != y for x, y in zip(a, g, strict=True)]
        if not any(wrong):
            continue
        with_error += 1
        for t in range(wrong.index(True) + 2, len(g) + 1):  # 1-based, after the first error
            c = counts[bucket_of(t)]
            c[0] += 1
            c[1] += wrong[t - 1]
            c[2] += b[t - 1] != g[t - 1]
    n, clean, self_ = (sum(c[k] for c in counts) for k in range(3))
    err_clean, err_self = ratio(clean, n), ratio(self_, n)
    excess = diff(err_self, err_clean)
    excess_pct = None if excess is None or not err_clean else 100 * excess / err_clean
    buckets = [
        Bucket(first, last, c[0], ratio(c[1], c[0]), ratio(c[2], c[0]))
        for (first, last), c in zip(BUCKETS, counts, strict=True)
    ]
    return Accumulation(err_clean, err_self, excess, excess_pct, n, with_error, len(gold), buckets)


def sparkline(
    values: Sequence[float | None], lo: float | None = None, hi: float | None = None
) -> str:
    """A block per value from ``▁`` at ``lo`` to ``█`` at ``hi`` (default: their range)."""
    known = [v for v in values if v is not None]
    lo = min(known, default=0.0) if lo is None else lo
    hi = max(known, default=0.0) if hi is None else hi
    top = len(SPARK) - 1
    return "".join(
        " "
        if v is None
        else SPARK[min(top, int((v - lo) / (hi - lo) * len(SPARK))) if hi > lo else 0]
        for v in values
    )


# ---------------------------------------------------------------------------- section 5
@dataclass(frozen=True)
class NoiseLevel:
    """TF accuracy with a share ``q`` of inputs replaced, and the clean one, on kept positions."""

    q: float
    acc: float | None
    clean_acc_same_positions: float | None
    paired_drop: float | None  # clean_acc_same_positions - acc
    kept: int
    replaced: int


@dataclass(frozen=True)
class PrefixNoise:
    """Section 5: accuracy per noise level and the drop to the last ``q``, as defined and paired."""

    seed: int
    levels: list[NoiseLevel]
    drop: float | None
    paired_drop: float | None


def noisy_inputs(
    inputs: Sequence[Sequence[int]], q: float, vocab_size: int, seed: int
) -> tuple[list[list[int]], list[list[bool]]]:
    """Replace each decoder input but ``<s>`` with probability ``q`` by a uniform non-special id;
    returns the inputs and the replaced flags. One generator draws a number and a candidate per
    position, sentence by sentence, so a higher ``q`` replaces a superset with the same tokens."""
    g = torch.Generator().manual_seed(seed)
    out, flags = [], []
    for seq in inputs:
        u = torch.rand(len(seq), generator=g).tolist()
        cand = torch.randint(N_SPECIAL, vocab_size, (len(seq),), generator=g).tolist()
        hit = [j > 0 and u[j] < q for j in range(len(seq))]
        out.append([c if h else tok for tok, c, h in zip(seq, cand, hit, strict=True)])
        flags.append(hit)
    return out, flags


def noise_level(
    q: float,
    gold: Sequence[Sequence[int]],
    clean_preds: Sequence[Sequence[int]],
    noisy_preds: Sequence[Sequence[int]],
    replaced: Sequence[Sequence[bool]],
) -> NoiseLevel:
    """Accuracy of the noisy and the clean pass on the positions whose own input was kept."""
    kept = noisy_ok = clean_ok = n_replaced = 0
    for g, a, b, r in zip(gold, clean_preds, noisy_preds, replaced, strict=True):
        for t in range(len(g)):
            if r[t]:
                n_replaced += 1
                continue
            kept += 1
            noisy_ok += b[t] == g[t]
            clean_ok += a[t] == g[t]
    acc, clean = ratio(noisy_ok, kept), ratio(clean_ok, kept)
    return NoiseLevel(q, acc, clean, diff(clean, acc), kept, n_replaced)


def prefix_noise(seed: int, levels: Sequence[NoiseLevel]) -> PrefixNoise:
    """Collect the levels (the first one ``q = 0``) and the drops to the last one."""
    first, last = levels[0], levels[-1]
    return PrefixNoise(seed, list(levels), diff(first.acc, last.acc), last.paired_drop)


# ---------------------------------------------------------------------------- section 6
@dataclass(frozen=True)
class Quartile:
    """Mean sentence chrF of greedy and of TF-argmax outputs for one reference-length quartile."""

    min_len: int | None
    max_len: int | None
    sentences: int
    greedy_chrf: float | None
    tf_chrf: float | None
    ratio: float | None  # greedy_chrf / tf_chrf


@dataclass(frozen=True)
class LengthDecay:
    """Section 6: ``decay_ratio`` = ratio in the longest quartile / ratio in the shortest."""

    quartiles: list[Quartile]
    decay_ratio: float | None


def quartiles(lengths: Sequence[int]) -> list[list[int]]:
    """Sentence indices in four equal-count groups by length (ties by index), shortest first."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    n = len(order)
    return [order[k * n // 4 : (k + 1) * n // 4] for k in range(4)]


def length_decay(
    ref_lengths: Sequence[int], refs: Sequence[str], greedy: Sequence[str], tf_argmax: Sequence[str]
) -> LengthDecay:
    """Section 6: sentence chrF of greedy and TF-argmax texts by reference-length quartile."""
    chrf = sacrebleu.CHRF()

    def mean_chrf(hyps: Sequence[str], idx: list[int]) -> float | None:
        total = sum(chrf.sentence_score(hyps[i], [refs[i]]).score for i in idx)
        return ratio(total, len(idx))

    rows = []
    for idx in quartiles(ref_lengths):
        g, t = mean_chrf(greedy, idx), mean_chrf(tf_argmax, idx)
        lens = [ref_lengths[i] for i in idx]
        rows.append(
            Quartile(min(lens, default=None), max(lens, default=None), len(idx), g, t, ratio(g, t))
        )
    return LengthDecay(rows, ratio(rows[-1].ratio, rows[0].ratio))


# ---------------------------------------------------------------------------- rendering
def render_accumulation(a: Accumulation) -> tuple[Group, Text]:
    """Section 4: the error rates per bucket and in all, the sparkline curve, and the caveat."""
    buckets = [(b.label, b.positions, b.err_clean, b.err_self) for b in a.buckets]
    rows = [
        [label, str(n), pct(clean), pct(self_), points(diff(self_, clean))]
        for label, n, clean, self_ in [*buckets, ("all", a.positions, a.err_clean, a.err_self)]
    ]
    rates = [v for b in a.buckets for v in (b.err_clean, b.err_self) if v is not None]
    lo, hi = min(rates, default=None), max(rates, default=None)
    excess_pct = "n/a" if a.excess_error_pct is None else f"{a.excess_error_pct:+.1f}%"
    caption = (
        f"excess_error_pct (excess / err_clean): {excess_pct}; positions strictly after the first"
        f" clean-pass error of {a.sentences_with_error} of {a.sentences} sentences\n"
        f"accumulation curve by bucket (▁ {pct(lo, '.1f')} .. █ {pct(hi, '.1f')}):"
        f"  clean {sparkline([b.err_clean for b in a.buckets], lo, hi)}"
        f"  self {sparkline([b.err_self for b in a.buckets], lo, hi)}"
    )
    t = table(
        "4. Error accumulation: clean TF pass vs the model reading its own TF errors",
        ["target position", "positions", "err_clean", "err_self", "excess_error"],
        rows,
        caption,
    )
    return t, Text(CAVEAT, style="dim")


def render_prefix_noise(p: PrefixNoise) -> Group:
    """Section 5: one row per noise level, the drops in the caption."""
    rows = [
        [
            f"{x.q:g}",
            pct(x.acc),
            pct(x.clean_acc_same_positions),
            points(x.paired_drop),
            str(x.kept),
            str(x.replaced),
        ]
        for x in p.levels
    ]
    caption = (
        "acc: TF accuracy with a share q of decoder inputs (not <s>) replaced by uniform"
        " non-special tokens, on positions whose own input was kept; clean acc: the clean pass on"
        " the same"
        f" positions (seed {p.seed})\n"
        f"drop q=0 -> {p.levels[-1].q:g}: {points(p.drop)} (as defined: all positions at q=0"
        f" vs kept ones); paired drop on the same positions: {points(p.paired_drop)}"
    )
    return table(
        "5. Prefix-noise sensitivity",
        ["q", "acc", "clean acc", "paired drop", "kept", "replaced"],
        rows,
        caption,
    )


def render_length_decay(d: LengthDecay) -> Group:
    """Section 6: one row per reference-length quartile, ``decay_ratio`` in the caption."""
    rows = [
        [
            f"Q{k + 1}",
            "n/a" if q.min_len is None else f"{q.min_len}-{q.max_len}",
            str(q.sentences),
            fmt(q.greedy_chrf),
            fmt(q.tf_chrf),
            fmt(q.ratio, ".3f"),
        ]
        for k, q in enumerate(d.quartiles)
    ]
    return table(
        "6. Length decay: mean sentence chrF by reference-length quartile",
        ["quartile", "ref tokens", "sentences", "greedy chrF", "TF chrF", "greedy/TF"],
        rows,
        f"decay_ratio = (greedy/TF in Q4) / (greedy/TF in Q1): {fmt(d.decay_ratio, '.3f')}"
        " (< 1: free-running quality falls faster with length)",
    )
