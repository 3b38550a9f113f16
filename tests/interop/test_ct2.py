"""CTranslate2 export: the converted model decodes as tformer does, token for token."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import skip_without

try:
    import ctranslate2
except ModuleNotFoundError as missing:
    skip_without("dev", missing)

import torch

from tests.interop.conftest import assert_one_line_error, cli, search_limit
from tformer_cli.checkpoint import load_run
from tformer_cli.config import DecodeConfig
from tformer_cli.data.tokenizer import encode
from tformer_cli.decode.translate import translate_ids
from tformer_cli.errors import TformerError
from tformer_cli.interop.ct2 import ctranslate2_cache, export_ctranslate2


@pytest.fixture(scope="module", params=["toy_run", "pre_ln_learned_run"])
def exported(request, tmp_path_factory) -> tuple[Path, Path]:
    """A run (post-LN sinusoidal tied ReLU, or pre-LN learned untied SiLU with an output bias)
    and its CTranslate2 export."""
    run = request.getfixturevalue(request.param)
    return run, export_ctranslate2(run, tmp_path_factory.mktemp("ct2") / "model")


def ctranslate2_best(
    model: Path, tokens: list[list[str]], limits: list[int], beam: int
) -> list[list[str]]:
    """CTranslate2's best hypothesis for each source, under tformer's settings: no length
    penalty, ``</s>`` allowed from the first step, and each sentence's own length limit (one
    call per sentence: CTranslate2's limit is one per batch)."""
    translator = ctranslate2.Translator(str(model), device="cpu", intra_threads=1)
    return [
        translator.translate_batch(
            [source], beam_size=beam, length_penalty=0.0, min_decoding_length=0,
            max_decoding_length=limit,
        )[0].hypotheses[0]
        for source, limit in zip(tokens, limits, strict=True)
    ]  # fmt: skip


@pytest.mark.parametrize("beam", [1, 5])
def test_ctranslate2_finds_tformers_best_hypothesis_on_the_toy_test_set(exported, toy_test, beam):
    """Greedy, and beam 5 at alpha 0: at alpha 0 both searches return their highest-scoring
    finished hypothesis and stop once no live beam can beat it, so they agree."""
    run_dir, model = exported
    run = load_run(run_dir, "cpu")
    torch.set_num_threads(1)
    cfg = DecodeConfig(beam=beam, alpha=0.0)
    sources = encode(run.tokenizer, toy_test)
    ours = [t.hypotheses[0] for t in translate_ids(run.model, sources, cfg)]
    tokens = [[run.tokenizer.id_to_token(i) for i in s] for s in sources]
    limits = [search_limit(s, cfg, run.config.model.max_positions) for s in sources]
    theirs = ctranslate2_best(model, tokens, limits, beam)
    mine = [[run.tokenizer.id_to_token(i) for i in h.tokens] for h in ours]
    differing = [i for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) if a != b]
    assert differing == [], f"{len(differing)} of {len(mine)} differ, first {differing[0]}"
    assert sum(h.finished for h in ours) >= len(ours) // 2  # mostly ended by </s>, not limits


def test_the_export_holds_the_tokenizer_and_a_cache_folder_follows_the_weights(toy_run, tmp_path):
    model = export_ctranslate2(toy_run, tmp_path / "int8", "int8")
    assert {"model.bin", "config.json", "tokenizer.json"} <= {p.name for p in model.iterdir()}
    assert (model / "tokenizer.json").read_bytes() == (toy_run / "tokenizer.json").read_bytes()
    cache = ctranslate2_cache(toy_run, "int8")
    assert cache.parent == toy_run / "ctranslate2" and cache.name.endswith("-int8")
    assert ctranslate2_cache(toy_run, "int8") == cache  # same weights, same folder


def test_bad_input_is_one_line_and_writes_nothing(toy_run, tmp_path):
    with pytest.raises(TformerError, match="unknown quantization 'int3'"):
        export_ctranslate2(toy_run, tmp_path / "q", "int3")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("mine")
    with pytest.raises(TformerError, match="already exists"):
        export_ctranslate2(toy_run, tmp_path / "taken")
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]  # no temporary folder left


def test_the_cli_exports_and_refuses_a_run_of_a_newer_format(toy_run, tmp_path):
    result = cli("export", "-m", toy_run, "--to", "ctranslate2", "-o", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "model.bin").is_file()
    newer = tmp_path / "newer"
    newer.mkdir()
    config = (toy_run / "config.json").read_text().replace('"format": 1', '"format": 99')
    (newer / "config.json").write_text(config)
    result = cli("export", "-m", newer, "--to", "ctranslate2", "-o", tmp_path / "none")
    assert_one_line_error(result, "run format 99")
    assert not (tmp_path / "none").exists()
    usage = cli("export", "-m", toy_run, "--to", "onnx", "-o", tmp_path / "x")
    assert usage.exit_code == 2 and "'onnx' must be one of ctranslate2, hf" in usage.output


def test_importing_an_export_is_refused_in_one_line_naming_ctranslate2(toy_run, tmp_path):
    model = export_ctranslate2(toy_run, tmp_path / "ct2")
    result = cli("import", model, "--runs-dir", tmp_path / "runs")
    assert_one_line_error(result, "is a CTranslate2 export", "cannot import CTranslate2", "--to hf")
    assert not (tmp_path / "runs").exists()
