"""Shared fixtures: a tiny Transformer factory, random padded token batches, a tiny corpus and run.

Everything here is small on purpose (d_model 32, vocabulary < 50, a few sentences) so the model
tests run in seconds on two CPU cores.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import pytest
import torch

from tformer_cli.config import ModelConfig, TrainConfig
from tformer_cli.data.tokenizer import EOS_ID, PAD_ID
from tformer_cli.model import Transformer

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"  # real corpora, outside the repository
VOCAB = 40
FIRST_WORD_ID = 4  # ids 0..3 are <pad> <unk> <s> </s>

# A copy task over ten words: the target is the source reversed.
WORDS = ["red", "blue", "green", "cat", "dog", "bird", "one", "two", "big", "small"]


def checkout_first_env(**extra: str) -> dict[str, str]:
    """This process's environment and ``extra``, with this checkout first on PYTHONPATH and
    what the PYTHONPATH had after it (a package found only there still imports in a child)."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, **extra, "PYTHONPATH": path}


def skip_without(extras: str, missing: Exception) -> NoReturn:
    """Skip the test module being collected: a package of tformer's optional ``extras`` (such as
    ``"dev,serve"``) is not installed, as ``missing`` (an import's error) says."""
    reason = f"needs tformer's optional packages (pip install -e '.[{extras}]'): {missing}"
    pytest.skip(reason, allow_module_level=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files holding a ``slow`` test first, the others in their order: ``make test``'s two
    processes take whole files as they finish one, so the long ones start early and the two
    end together instead of one running a long file alone at the end."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)  # stable: an order within each group


@pytest.fixture(autouse=True)
def one_torch_thread() -> None:
    """Run torch on one thread: on two shared cores, two threads of tiny ops run ~50x slower
    whenever another process is busy. Reset before every test because ``setup_threads`` (called
    by the trainer and the CLI) raises the count again."""
    torch.set_num_threads(1)


def tiny_config(**overrides: Any) -> ModelConfig:
    """A two-layer model, d_model 32, dropout 0, 40 token ids."""
    values: dict[str, Any] = dict(
        vocab_size=VOCAB,
        d_model=32,
        h=4,
        d_ff=64,
        n_encoder_layers=2,
        n_decoder_layers=2,
        dropout=0.0,
        max_positions=64,
    )
    values.update(overrides)
    return ModelConfig(**values)


@pytest.fixture
def tiny_cfg() -> Callable[..., ModelConfig]:
    """``tiny_cfg(**overrides)``: the ``ModelConfig`` of ``tiny_model``."""
    return tiny_config


@pytest.fixture
def tiny_model() -> Callable[..., Transformer]:
    """``tiny_model(seed=0, **config_overrides)``: a freshly initialised eval-mode Transformer."""

    def make(seed: int = 0, **overrides: Any) -> Transformer:
        torch.manual_seed(seed)
        return Transformer(tiny_config(**overrides)).eval()

    return make


def _padded(lengths: Sequence[int], vocab: int, eos: bool, generator: torch.Generator):
    """Rows of random word ids (ids >= 4) of the given real lengths, right-padded with 0."""
    out = torch.full((len(lengths), max(lengths)), PAD_ID, dtype=torch.long)
    for i, n in enumerate(lengths):
        words = n - 1 if eos else n
        out[i, :words] = torch.randint(FIRST_WORD_ID, vocab, (words,), generator=generator)
        if eos:
            out[i, words] = EOS_ID
    return out


@pytest.fixture
def token_batch() -> Callable[..., torch.Tensor]:
    """``token_batch(lengths, seed=0, eos=True)``: (B, max(lengths)) ids, padded with 0.

    With ``eos`` the last real token of each row is ``</s>`` (a source as the model sees it).
    """

    def make(
        lengths: Sequence[int], seed: int = 0, eos: bool = True, vocab: int = VOCAB
    ) -> torch.Tensor:
        return _padded(lengths, vocab, eos, torch.Generator().manual_seed(seed))

    return make


def reversal_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` pairs (source, source reversed) of 3 to 6 words drawn from ``WORDS``."""
    g = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(n):
        length = int(torch.randint(3, 7, (1,), generator=g))
        words = [WORDS[int(i)] for i in torch.randint(0, len(WORDS), (length,), generator=g)]
        pairs.append((" ".join(words), " ".join(reversed(words))))
    return pairs


@pytest.fixture
def tiny_corpus(tmp_path: Path) -> Path:
    """A folder with train/valid/test.tsv of a word-reversal task (40/6/6 pairs)."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    for name, n, seed in (("train", 40, 1), ("valid", 6, 2), ("test", 6, 3)):
        text = "".join(f"{s}\t{t}\n" for s, t in reversal_pairs(n, seed))
        (folder / f"{name}.tsv").write_text(text, encoding="utf-8")
    return folder


@pytest.fixture
def make_run() -> Callable[..., tuple[Path, Transformer]]:
    """``make_run(run_dir, seed=0)``: write an untrained but complete run folder.

    config.json + tokenizer.json (word-level over ``WORDS``) + model.pt; returns the folder and
    the model whose weights were saved.
    """
    from tformer_cli.checkpoint import RunConfig, atomic_torch_save
    from tformer_cli.data.tokenizer import save_tokenizer, train_tokenizer

    def make(run_dir: Path, seed: int = 0) -> tuple[Path, Transformer]:
        texts = [" ".join(WORDS)] * 3
        tok = train_tokenizer(texts, vocab_size=VOCAB, kind="wordlevel", min_frequency=1)
        save_tokenizer(tok, run_dir / "tokenizer.json")
        cfg = tiny_config(vocab_size=tok.get_vocab_size())
        torch.manual_seed(seed)
        model = Transformer(cfg).eval()
        RunConfig(cfg, TrainConfig(device="cpu", precision="fp32")).save(run_dir)
        atomic_torch_save(run_dir / "model.pt", model.state_dict())
        return run_dir, model

    return make


@pytest.fixture
def single_thread_trainer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the trainer from raising torch's thread count on the shared two-core machine."""
    from tformer_cli.training import bookkeeping as training

    monkeypatch.setattr(training, "setup_threads", lambda: None)
