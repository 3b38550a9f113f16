"""Real data (slow): `tformer train` on the first 10k Multi30k de->en pairs learns to translate,
and a second run on the same data starts from the tokenized-data cache."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import SHARED_DATA
from tformer_cli.cli import app

MULTI30K = SHARED_DATA / "multi30k"
TRAIN_PAIRS = 10_000
# About half the test2016 greedy BLEU that this test's 300 updates reach, rounded down
BLEU_FLOOR = 8.0

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not MULTI30K.is_dir(), reason=f"{MULTI30K} is absent (Multi30k lives outside the repo)"
    ),
]


@pytest.fixture
def multi30k_head(tmp_path: Path) -> Path:
    """The first TRAIN_PAIRS training pairs, all of val and test2016, in a folder of tmp_path."""
    folder = tmp_path / "multi30k"
    folder.mkdir()
    for lang in ("de", "en"):
        with open(MULTI30K / f"train.{lang}", encoding="utf-8") as f:
            head = [next(f) for _ in range(TRAIN_PAIRS)]
        (folder / f"train.{lang}").write_text("".join(head), encoding="utf-8")
        for split in ("val", "test2016"):
            text = (MULTI30K / f"{split}.{lang}").read_text(encoding="utf-8")
            (folder / f"{split}.{lang}").write_text(text, encoding="utf-8")
    return folder


def train(data: Path, runs: Path, name: str, *options: str) -> str:
    """`tformer train` of a 2+2-layer d=128 model with a 4k vocabulary; its stdout + stderr."""
    result = CliRunner().invoke(
        app,
        ["train", "--data", str(data), "--src", "de", "--tgt", "en", "--runs-dir", str(runs),
         "--name", name, "--d-model", "128", "--layers", "2", "--vocab-size", "4000",
         "--device", "cpu", "--precision", "fp32", "--epochs", "0", "--valid-every", "100",
         "--valid-bleu-size", "200", *options],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return result.output


def test_a_small_model_learns_multi30k_and_a_second_run_reuses_the_cache(tmp_path, multi30k_head):
    """300 updates on every core, with no time cap: a slow CPU would stop early under a cap,
    which would make the floor a test of the CPU."""
    runs = tmp_path / "runs"
    output = train(multi30k_head, runs, "first", "--max-steps", "300", "--average", "3")
    bleu = float(re.search(r"test BLEU \(greedy, sacrebleu\): ([\d.]+)", output)[1])
    assert bleu > BLEU_FLOOR
    log = (runs / "first" / "log.jsonl").read_text(encoding="utf-8")
    records = [json.loads(line) for line in log.splitlines()]
    assert any("kept" in r for r in records)  # the last 3 checkpoints were averaged and scored
    second = train(multi30k_head, runs, "second", "--max-steps", "1")
    assert "reusing cached tokenized data" in second, second
