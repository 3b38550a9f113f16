"""Tests for tformer_cli.report.request: what an ``EvalRequest`` resolves to against a run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tformer_cli.checkpoint import RunConfig
from tformer_cli.config import DecodeConfig
from tformer_cli.data.corpus import FILES, PARALLEL_FILES
from tformer_cli.errors import TformerError
from tformer_cli.report.evaluation import EvalConfig
from tformer_cli.report.request import EvalRequest


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"split": "dev"}, "unknown split 'dev': use train, valid, test or all"),
        ({"data": "toy", "src_file": Path("a")}, "give --data or --src-file/--tgt-file, not both"),
    ],
)
def test_options_that_cannot_go_together_fail_before_any_work(options, message):
    with pytest.raises(TformerError, match=message):
        EvalRequest(**options).check()
    EvalRequest(split="all").check()


def test_the_default_is_the_runs_own_test_split_with_its_languages_and_files(corpus_run):
    train = RunConfig.load(corpus_run).train
    data = EvalRequest().data_for(train)
    assert (data.spec, data.split, data.name) == (train.data, "test", train.data)
    assert (data.src_lang, data.tgt_lang, data.carve_seed) == (
        train.src_lang,
        train.tgt_lang,
        train.seed,
    )
    assert set(data.files) == set(PARALLEL_FILES)
    other = EvalRequest(data="toy", src_lang="xx", split="valid").data_for(train)
    assert (other.spec, other.files, other.split, other.src_lang) == ("toy", {}, "valid", "xx")


def test_two_plain_files_are_every_pair_in_order(corpus_run, tmp_path):
    train = RunConfig.load(corpus_run).train
    src, tgt = tmp_path / "a.txt", tmp_path / "b.txt"
    data = EvalRequest(src_file=src, tgt_file=tgt, split="test").data_for(train)
    assert (data.spec, data.split, data.name) == (FILES, "all", f"{src} + {tgt}")
    assert data.files == {"src_file": src, "tgt_file": tgt}


def test_the_key_holds_what_the_numbers_depend_on(corpus_run, tmp_path):
    config = RunConfig.load(corpus_run)
    cpu = torch.device("cpu")
    asked = EvalRequest(limit=3, config=EvalConfig(DecodeConfig(beam=2)), device="cpu")
    key = asked.key(corpus_run, config, cpu, None)
    assert (key.data, key.split, key.limit, key.precision, key.device) == (
        config.train.data,
        "test",
        3,
        "fp32",
        "cpu",
    )
    assert asked.key(corpus_run, config, cpu, torch.bfloat16).precision == "bf16"
    src, tgt = tmp_path / "a.txt", tmp_path / "b.txt"
    on_files = EvalRequest(src_file=src, tgt_file=tgt).key(corpus_run, config, cpu, None)
    assert (on_files.data, on_files.split) == (FILES, "all")
    assert on_files.files == (str(src.resolve()), str(tgt.resolve()))
    assert asked.placement(config) == (cpu, None)  # the run trained in fp32
