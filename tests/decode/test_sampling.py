"""Tests for tformer_cli.decode.sampling: the limits (temperature -> 0 and top-k 1 are argmax),
repeatable draws, frequencies against the distribution (a chi-square test that can fail), the
exact support that top-k, top-p and epsilon keep, forbidden tokens, and the settings' checks."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from tformer_cli.config import SamplingConfig
from tformer_cli.decode.sampling import sample_next
from tformer_cli.errors import TformerError

# A hand-made distribution over 6 tokens; token 0 is forbidden (<pad>, log-probability -inf).
P = [0.0, 0.4, 0.25, 0.15, 0.12, 0.08]


def logprobs(p: list[float], rows: int = 1) -> Tensor:
    """(rows, V) fp32 log-probabilities of ``p``, every row the same; 0 -> -inf."""
    return torch.tensor(p).log().expand(rows, -1).contiguous()


def draw(logp: Tensor, seed: int = 0, **settings: float | int | None) -> Tensor:
    """``sample_next`` with ``SamplingConfig(**settings)`` and a generator seeded with ``seed``."""
    cfg = SamplingConfig(**settings)  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(seed)
    return sample_next(logp, cfg.temperature, cfg.top_k, cfg.top_p, cfg.epsilon, g)


def chi2_pvalue(tokens: Tensor, expected: list[float]) -> float:
    """Pearson's chi-square test of the drawn ``tokens`` against the probabilities ``expected``
    (over the tokens with expected > 0; drawing any other one fails outright): P(X^2 >= x) for
    X^2 ~ chi2(k - 1), the regularised upper incomplete gamma Q((k - 1) / 2, x / 2)."""
    n = tokens.numel()
    counts = torch.bincount(tokens, minlength=len(expected)).double()
    p = torch.tensor(expected, dtype=torch.float64)
    support = p > 0
    if counts[~support].sum() > 0:
        return 0.0
    e = n * p[support] / p.sum()
    x2 = ((counts[support] - e) ** 2 / e).sum()
    df = torch.tensor((int(support.sum()) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(df, x2 / 2))


def normalised(w: list[float]) -> list[float]:
    return [x / sum(w) for x in w]


def test_chi2_pvalue_matches_the_table() -> None:
    """The 5% critical value of chi2 with 5 degrees of freedom is 11.0705."""
    df, x = torch.tensor(2.5, dtype=torch.float64), torch.tensor(11.0705 / 2, dtype=torch.float64)
    assert float(torch.special.gammaincc(df, x)) == pytest.approx(0.05, abs=1e-5)


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({}, P),
        ({"temperature": 2.0}, normalised([p**0.5 for p in P])),
        ({"temperature": 0.5}, normalised([p**2 for p in P])),
        ({"top_k": 3}, normalised([*P[:4], 0, 0])),
        ({"top_p": 0.7}, normalised([*P[:4], 0, 0])),  # 0.4 + 0.25 < 0.7 <= 0.4 + 0.25 + 0.15
        ({"epsilon": 0.1}, normalised([*P[:5], 0])),
        (
            {"temperature": 2.0, "top_k": 4, "top_p": 0.5},
            normalised([0, 0.4**0.5, 0.25**0.5, 0, 0, 0]),
        ),
    ],
)
def test_frequencies_match_the_distribution(settings: dict, expected: list[float]) -> None:
    tokens = draw(logprobs(P, rows=20_000), seed=1, **settings)
    assert chi2_pvalue(tokens, expected) > 1e-4


def test_chi2_test_rejects_a_wrong_distribution() -> None:
    tokens = draw(logprobs(P, rows=20_000), seed=1)
    assert chi2_pvalue(tokens, [0.0, 0.38, 0.27, 0.15, 0.12, 0.08]) < 1e-6  # 2% moved
    assert chi2_pvalue(tokens, normalised([p**0.5 for p in P])) < 1e-6  # temperature 2
    assert chi2_pvalue(tokens, [0.0, 0.5, 0.5, 0.0, 0.0, 0.0]) == 0.0  # outside the support


def test_tiny_temperature_is_argmax() -> None:
    logp = (3 * torch.randn(64, 50, generator=torch.Generator().manual_seed(0))).log_softmax(-1)
    for seed in range(3):
        assert torch.equal(draw(logp, seed, temperature=1e-4), logp.argmax(dim=-1))


def test_top_k_one_is_argmax() -> None:
    logp = torch.randn(64, 50, generator=torch.Generator().manual_seed(0)).log_softmax(-1)
    for seed in range(3):
        for temperature in (1.0, 10.0):
            tokens = draw(logp, seed, temperature=temperature, top_k=1)
            assert torch.equal(tokens, logp.argmax(dim=-1))


def test_same_seed_same_draws() -> None:
    logp = torch.randn(256, 50, generator=torch.Generator().manual_seed(0)).log_softmax(-1)
    settings = {"temperature": 0.8, "top_k": 20, "top_p": 0.95, "epsilon": 0.001}
    first = draw(logp, 7, **settings)
    assert torch.equal(draw(logp, 7, **settings), first)
    assert not torch.equal(draw(logp, 8, **settings), first)
    assert first.shape == (256,) and first.dtype == torch.long


def support(settings: dict, p: list[float] = P) -> set[int]:
    """The tokens drawn in 4,000 draws: the whole support, since each kept token has p >= 0.05."""
    return set(draw(logprobs(p, rows=4_000), seed=3, **settings).tolist())


@pytest.mark.parametrize(
    ("top_p", "kept"),
    [
        (0.3, {1}),
        (0.6, {1, 2}),
        (0.7, {1, 2, 3}),
        (0.85, {1, 2, 3, 4}),
        (0.95, {1, 2, 3, 4, 5}),
        (1.0, {1, 2, 3, 4, 5}),
    ],
)
def test_top_p_keeps_the_smallest_set_of_enough_mass(top_p: float, kept: set[int]) -> None:
    assert support({"top_p": top_p}) == kept


@pytest.mark.parametrize(("top_p", "kept"), [(0.5, {1}), (0.75, {1, 2}), (0.875, {1, 2, 3})])
def test_top_p_stops_where_the_mass_reaches_p_exactly(top_p: float, kept: set[int]) -> None:
    """Dyadic probabilities, exact in fp32: a set of mass exactly p is enough."""
    assert support({"top_p": top_p}, [0.0, 0.5, 0.25, 0.125, 0.125]) == kept


def test_filters_apply_to_the_renormalised_distribution() -> None:
    """After top-k 2, the tokens' probabilities are 0.4 / 0.65 = 0.62 and 0.25 / 0.65 = 0.38."""
    assert support({"top_k": 2, "top_p": 0.5}) == {1}  # 0.62 >= 0.5 (but 0.4 < 0.5)
    assert support({"top_k": 2, "epsilon": 0.3}) == {1, 2}  # 0.38 >= 0.3 (but 0.25 < 0.3)
    assert support({"top_p": 0.6, "epsilon": 0.35}) == {1, 2}  # 0.25 / 0.65 >= 0.35


@pytest.mark.parametrize(
    ("epsilon", "kept"),
    [(0.0, {1, 2, 3, 4, 5}), (0.1, {1, 2, 3, 4}), (0.13, {1, 2, 3}), (0.2, {1, 2}), (0.9, {1})],
)
def test_epsilon_drops_the_improbable_tokens_but_never_the_top(
    epsilon: float, kept: set[int]
) -> None:
    assert support({"epsilon": epsilon}) == kept


@pytest.mark.parametrize(
    ("top_k", "kept"), [(1, {1}), (2, {1, 2}), (5, {1, 2, 3, 4, 5}), (9, {1, 2, 3, 4, 5})]
)
def test_top_k_keeps_exactly_k(top_k: int, kept: set[int]) -> None:
    assert support({"top_k": top_k}) == kept


def test_top_k_breaks_ties_to_exactly_k() -> None:
    tokens = draw(logprobs([0.0, 0.25, 0.25, 0.25, 0.25], rows=1_000), top_k=2)
    assert len(set(tokens.tolist())) == 2


@pytest.mark.parametrize("temperature", [1e-4, 1.0, 1e3])
def test_forbidden_tokens_are_never_drawn(temperature: float) -> None:
    logp = torch.randn(500, 30, generator=torch.Generator().manual_seed(0)).log_softmax(-1)
    logp[:, :3] = -math.inf  # <pad> <unk> <s>
    logp[0, 4:] = -math.inf  # row 0: token 3 is the only one left
    for settings in ({}, {"top_k": 40}, {"top_p": 1.0}, {"epsilon": 0.0}):
        tokens = draw(logp, temperature=temperature, **settings)
        assert tokens.min() >= 3 and tokens[0] == 3


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"temperature": 0.0}, "temperature"),
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": 1e-300}, "temperature"),  # 0 in fp32: the draw was empty, score -inf
        ({"temperature": 1e300}, "temperature"),
        ({"top_k": 0}, "top_k="),
        ({"top_p": 0.0}, "top_p="),
        ({"top_p": 1.5}, "top_p="),
        ({"top_p": math.nan}, "top_p="),
        ({"epsilon": -0.1}, "epsilon"),
        ({"epsilon": 1.0}, "epsilon"),
    ],
)
def test_bad_settings_are_one_line_errors(settings: dict, message: str) -> None:
    with pytest.raises(TformerError, match=message) as error:
        SamplingConfig(**settings)
    assert "\n" not in str(error.value)


def test_good_settings_are_accepted() -> None:
    SamplingConfig(temperature=1e-4, top_k=1, top_p=1.0, epsilon=0.0)
    SamplingConfig(temperature=1e4)
    SamplingConfig(temperature=100.0, top_k=50, top_p=1e-3, epsilon=0.999)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.filterwarnings("ignore:Synchronization debug mode is a prototype")
def test_no_host_sync_on_cuda() -> None:
    """A host sync (``.item()``, ``nonzero``, a tensor in an ``if``) would raise an error."""
    logp = torch.randn(64, 1000, device="cuda").log_softmax(-1)
    g = torch.Generator(device="cuda").manual_seed(0)
    sample_next(logp, 1.0, 50, 0.9, 1e-4, g)  # warm-up: lazy initialisation may sync
    torch.cuda.set_sync_debug_mode("error")
    try:
        tokens = sample_next(logp, 0.7, 50, 0.9, 1e-4, g)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert tokens.shape == (64,) and tokens.device.type == "cuda"
