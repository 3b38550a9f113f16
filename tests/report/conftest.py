"""Fixtures of the report tests."""

from __future__ import annotations

import pytest

from tformer_cli.checkpoint import RunConfig
from tformer_cli.config import TrainConfig


@pytest.fixture
def corpus_run(tmp_path, make_run, tiny_corpus):
    """An untrained run whose config says it was trained on ``tiny_corpus`` in fp32."""
    run_dir, model = make_run(tmp_path / "run")
    train = TrainConfig(data=str(tiny_corpus), device="cpu", precision="fp32")
    RunConfig(model.cfg, train).save(run_dir)
    return run_dir
