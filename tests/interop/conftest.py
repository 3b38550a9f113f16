"""Shared by the interop tests: small run folders trained briefly on the toy corpus, and the
toy test sentences they translate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import Result
from typer.testing import CliRunner

from tformer_cli.checkpoint import RunConfig, atomic_torch_save
from tformer_cli.cli import app
from tformer_cli.config import DecodeConfig, ModelConfig, TrainConfig
from tformer_cli.data.batching import make_batch, pad
from tformer_cli.data.corpus import toy_corpus_dir
from tformer_cli.data.tokenizer import EOS_ID, PAD_ID, encode, save_tokenizer, train_tokenizer
from tformer_cli.decode.reference import max_lengths
from tformer_cli.model import Transformer


@pytest.fixture(autouse=True)
def one_thread_in_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands' ``setup_threads`` keeps torch on one thread, as the tests do."""
    monkeypatch.setenv("TFORMER_THREADS", "1")


TEST_SENTENCES = 100  # of the toy test set: enough finished and length-limited rows, in seconds


def toy_pairs(split: str, n: int) -> tuple[list[str], list[str]]:
    lines = (toy_corpus_dir() / f"{split}.tsv").read_text(encoding="utf-8").splitlines()[:n]
    pairs = [line.split("\t") for line in lines]
    return [s for s, _ in pairs], [t for _, t in pairs]


def train_toy_run(run_dir: Path, steps: int, **model: Any) -> Path:
    """A complete run folder: a BPE tokenizer and a two-layer d_model 32 model trained
    ``steps`` updates (batches of 32 toy pairs, no dropout); ``model``: ModelConfig overrides."""
    src, tgt = toy_pairs("train", 2000)
    tok = train_tokenizer(src + tgt, vocab_size=300)
    save_tokenizer(tok, run_dir / "tokenizer.json")
    src_ids, tgt_ids = encode(tok, src), encode(tok, tgt)
    cfg = ModelConfig(
        vocab_size=tok.get_vocab_size(), d_model=32, h=4, d_ff=64, n_encoder_layers=2,
        n_decoder_layers=2, dropout=0.0, max_positions=128, **model,
    )  # fmt: skip
    torch.manual_seed(0)
    net = Transformer(cfg)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    for step in range(steps):
        at = slice(32 * step % 2000, 32 * step % 2000 + 32)
        b = make_batch(src_ids[at], tgt_ids[at])
        logits = net(b.src, b.tgt_in)  # (B, T, V)
        loss = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), b.tgt_out.flatten(), ignore_index=PAD_ID
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    RunConfig(cfg, TrainConfig(device="cpu", precision="fp32")).save(run_dir)
    atomic_torch_save(run_dir / "model.pt", net.state_dict())
    return run_dir


@pytest.fixture(scope="session")
def toy_run(tmp_path_factory) -> Path:
    """The toy recipe's architecture (post-LN, sinusoidal, tied), trained briefly."""
    torch.set_num_threads(1)
    return train_toy_run(tmp_path_factory.mktemp("toy") / "run", steps=60)


@pytest.fixture(scope="session")
def pre_ln_learned_run(tmp_path_factory) -> Path:
    """Pre-LN, learned positions, untied, SiLU and an output bias: what HF's Marian cannot hold."""
    torch.set_num_threads(1)
    return train_toy_run(
        tmp_path_factory.mktemp("pre") / "run", steps=60, norm="pre", positional="learned",
        tie_embeddings=False, activation="silu", output_bias=True,
    )  # fmt: skip


@pytest.fixture(scope="session")
def toy_test() -> list[str]:
    return toy_pairs("test", TEST_SENTENCES)[0]


runner = CliRunner()


def cli(*args: str) -> Result:
    """``tformer ARGS`` in this process."""
    return runner.invoke(app, [str(a) for a in args])


def assert_one_line_error(result: Result, *fragments: str) -> None:
    """Exit 1 with one ``Error:`` line on stderr naming ``fragments``, no traceback."""
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:"), result.stderr
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def search_limit(source: list[int], cfg: DecodeConfig, max_positions: int) -> int:
    """tformer's limit on generated tokens for one source (``max_lengths``), ``</s>`` included."""
    return int(max_lengths(pad([[*source, EOS_ID]]), cfg, max_positions)[0])
