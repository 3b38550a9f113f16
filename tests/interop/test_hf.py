"""Hugging Face: a run exported as a MarianMTModel, and a Marian checkpoint imported as a run,
each computing what the other side computes."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import stat
from pathlib import Path

import pytest

from tests.conftest import skip_without

try:
    import sentencepiece as spm
    from transformers import (
        AutoModelForSeq2SeqLM,
        AutoTokenizer,
        GenerationConfig,
        MarianConfig,
        MarianMTModel,
        MarianTokenizer,
    )
except ModuleNotFoundError as missing:
    skip_without("dev", missing)

import torch

from tests.interop.conftest import assert_one_line_error, cli, search_limit, toy_pairs
from tformer_cli.checkpoint import TARGET_TOKENIZER, RunConfig, atomic_torch_save, load_run
from tformer_cli.config import DecodeConfig
from tformer_cli.data.batching import make_batch
from tformer_cli.data.data_cache import CACHE_DIR, read_split
from tformer_cli.data.split import Split
from tformer_cli.data.tokenizer import EOS_ID, PAD_ID, decode, encode
from tformer_cli.decode.translate import translate_ids
from tformer_cli.files import umask
from tformer_cli.interop.hf import export_hf, import_marian, run_config
from tformer_cli.model import Transformer
from tformer_cli.report.runs import collect_run
from tformer_cli.training import bookkeeping

pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """No test here may reach the Hub."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)


# ---------------------------------------------------------------------------- export
@pytest.fixture(scope="module")
def exported(toy_run, tmp_path_factory) -> Path:
    return export_hf(toy_run, tmp_path_factory.mktemp("hf") / "marian")


def test_the_exported_marian_model_computes_tformers_logits(toy_run, exported, toy_test):
    run = load_run(toy_run, "cpu")
    torch.set_num_threads(1)
    model = AutoModelForSeq2SeqLM.from_pretrained(exported).eval()
    tokenizer = AutoTokenizer.from_pretrained(exported)
    targets = toy_pairs("test", len(toy_test))[1]
    b = make_batch(encode(run.tokenizer, toy_test), encode(run.tokenizer, targets))
    assert torch.equal(tokenizer(toy_test, return_tensors="pt", padding=True).input_ids, b.src)
    with torch.no_grad():
        ours = run.model(b.src, b.tgt_in)
        theirs = model(input_ids=b.src, attention_mask=b.src != PAD_ID,
                       decoder_input_ids=b.tgt_in).logits  # fmt: skip
    real = b.tgt_in != PAD_ID
    assert torch.allclose(ours[real], theirs[real], atol=1e-4)


def test_the_exported_model_generates_tformers_greedy_translations(toy_run, exported, toy_test):
    run = load_run(toy_run, "cpu")
    torch.set_num_threads(1)
    model = AutoModelForSeq2SeqLM.from_pretrained(exported).eval()
    tokenizer = AutoTokenizer.from_pretrained(exported)
    sources = encode(run.tokenizer, toy_test)
    ours = translate_ids(run.model, sources, DecodeConfig(beam=1))
    batch = tokenizer(toy_test, return_tensors="pt", padding=True)
    generated = model.generate(**batch, do_sample=False)
    texts = tokenizer.batch_decode(generated, skip_special_tokens=True)
    assert texts == [decode(run.tokenizer, [t.hypotheses[0].tokens])[0] for t in ours]
    assert all(t.hypotheses[0].finished for t in ours)  # none cut by the (different) limits
    assert GenerationConfig.from_pretrained(exported).max_length == run.config.model.max_positions


def test_an_untied_silu_run_with_an_output_bias_exports_exactly(tmp_path, make_run, token_batch):
    run_dir, _ = make_run(tmp_path / "run")
    config = RunConfig.load(run_dir)
    cfg = dataclasses.replace(
        config.model, tie_embeddings=False, activation="silu", output_bias=True
    )
    torch.manual_seed(1)
    net = Transformer(cfg).eval()
    with torch.no_grad():
        net.generator.bias.normal_()
    dataclasses.replace(config, model=cfg).save(run_dir)
    atomic_torch_save(run_dir / "model.pt", net.state_dict())
    model = AutoModelForSeq2SeqLM.from_pretrained(export_hf(run_dir, tmp_path / "hf")).eval()
    assert not model.config.tie_word_embeddings
    V = cfg.vocab_size
    src, y = token_batch([5, 3], vocab=V), token_batch([4, 2], seed=1, eos=False, vocab=V)
    with torch.no_grad():
        theirs = model(input_ids=src, attention_mask=src != PAD_ID, decoder_input_ids=y).logits
        assert torch.allclose(net(src, y), theirs, atol=1e-4)


def test_a_pre_ln_run_is_refused_in_one_line_naming_the_ctranslate2_route(
    pre_ln_learned_run, tmp_path
):
    result = cli("export", "-m", pre_ln_learned_run, "--to", "hf", "-o", tmp_path / "out")
    assert_one_line_error(result, "pre-LN", "--to ctranslate2")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------- round trip
def with_beam_alpha(run_dir: Path, alpha: float, copy: Path) -> Path:
    """A copy of the run whose beam search ranks by ``alpha`` (training never reads it)."""
    copy.mkdir()
    for name in ("model.pt", "tokenizer.json"):
        shutil.copyfile(run_dir / name, copy / name)
    config = RunConfig.load(run_dir)
    dataclasses.replace(config, train=dataclasses.replace(config.train, beam_alpha=alpha)).save(
        copy
    )
    return copy


def translations(run_dir: Path, texts: list[str], *options: str) -> str:
    result = cli("translate", "-m", run_dir, *options, *texts)
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("alpha", [None, 1.2], ids=["default-alpha", "alpha-1.2"])
def test_an_export_imports_back_as_the_run_it_was(toy_run, alpha, toy_test, tmp_path):
    run = toy_run if alpha is None else with_beam_alpha(toy_run, alpha, tmp_path / "run")
    exported, runs = tmp_path / "hf", tmp_path / "runs"
    result = cli("export", "-m", run, "--to", "hf", "-o", exported)
    assert result.exit_code == 0, result.output
    result = cli("import", exported, "--runs-dir", runs, "--name", "back")
    assert result.exit_code == 0, result.output
    back, config = runs / "back", RunConfig.load(run)
    assert RunConfig.load(back).model == config.model  # dropout and no output bias included
    assert RunConfig.load(back).train.beam_alpha == config.train.beam_alpha == (alpha or 0.6)
    assert RunConfig.load(back).train.precision == config.train.precision == "fp32"
    assert (back / "tokenizer.json").read_text() == (run / "tokenizer.json").read_text()
    ours, theirs = torch.load(run / "model.pt"), torch.load(back / "model.pt")
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    texts = toy_test[:30]
    for beam in ("1", "5"):
        assert translations(back, texts, "-k", beam) == translations(run, texts, "-k", beam)
    if alpha is not None:  # and alpha changes the beam's choice for some of these texts
        assert translations(back, texts, "-k", "5") != translations(run, texts, "--alpha", "0.6")


def test_the_export_writes_its_weights_with_the_mode_of_its_other_files(exported):
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in exported.iterdir()}
    assert modes["model.safetensors"] == modes["tokenizer.json"] == 0o666 & ~umask()


def test_an_export_that_cannot_come_back_says_why_in_one_line(exported, tmp_path):
    runs = tmp_path / "runs"
    plain = shutil.copytree(exported, tmp_path / "plain")  # a Marian folder without spm files
    raw = json.loads((plain / "config.json").read_text())
    settings = raw.pop("tformer")
    (plain / "config.json").write_text(json.dumps(raw))
    result = cli("import", plain, "--runs-dir", runs)
    assert_one_line_error(result, "has no source.spm, target.spm, vocab.json")
    (plain / "config.json").write_text(json.dumps({**raw, "tformer": {"model": "?"}}))
    assert_one_line_error(cli("import", plain, "--runs-dir", runs), "tformer settings are corrupt")
    settings["model"]["n_decoder_layers"] += 1
    (plain / "config.json").write_text(json.dumps({**raw, "tformer": settings}))
    assert_one_line_error(cli("import", plain, "--runs-dir", runs), "do not fit its tformer")
    untokenized = shutil.copytree(exported, tmp_path / "untokenized")
    (untokenized / "tokenizer.json").unlink()
    assert_one_line_error(cli("import", untokenized, "--runs-dir", runs), "has no tokenizer.json")
    assert not runs.exists() or list(runs.iterdir()) == []


# ---------------------------------------------------------------------------- import
def train_spm(texts: list[str], path: Path) -> Path:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=model, vocab_size=120, model_type="unigram",
        minloglevel=2,
    )  # fmt: skip
    path.write_bytes(model.getvalue())
    return path


@pytest.fixture(scope="module")
def marian_folder(tmp_path_factory) -> Path:
    """A tiny randomly initialised MarianMTModel as opus-mt checkpoints are laid out: one
    vocabulary (``</s>`` 0, ``<unk>`` 1, ``<pad>`` last, the decoder's start), SentencePiece per
    side trained on the toy corpus, SiLU, a non-zero final_logits_bias, pad banned in generation."""
    root = tmp_path_factory.mktemp("marian")
    src, tgt = toy_pairs("train", 2000)
    spms = [train_spm(src, root / "source.spm"), train_spm(tgt, root / "target.spm")]
    vocab = {"</s>": 0, "<unk>": 1}
    for path in spms:
        sp = spm.SentencePieceProcessor(model_file=str(path))
        for i in range(sp.get_piece_size()):
            if not (sp.is_control(i) or sp.is_unknown(i)):
                vocab.setdefault(sp.id_to_piece(i), len(vocab))
    pad = vocab["<pad>"] = len(vocab)
    (root / "vocab.json").write_text(json.dumps(vocab))
    config = MarianConfig(
        vocab_size=pad + 1, decoder_vocab_size=pad + 1, d_model=32, encoder_layers=2,
        decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=64, decoder_ffn_dim=64, activation_function="swish",
        max_position_embeddings=128, scale_embedding=True, pad_token_id=pad, eos_token_id=0,
        decoder_start_token_id=pad, forced_eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_()
    model.generation_config = GenerationConfig(
        decoder_start_token_id=pad, eos_token_id=0, pad_token_id=pad, bad_words_ids=[[pad]],
        max_length=128,
    )  # fmt: skip
    folder = root / "opus-mt-toy"
    model.save_pretrained(folder)
    MarianTokenizer(*map(str, (*spms, root / "vocab.json")), source_lang="en",
                    target_lang="de").save_pretrained(folder)  # fmt: skip
    return folder


@pytest.fixture(scope="module")
def imported(marian_folder, tmp_path_factory) -> Path:
    return import_marian(str(marian_folder), tmp_path_factory.mktemp("runs"))


def test_an_imported_marian_model_computes_transformers_logits(marian_folder, imported, toy_test):
    marian = MarianMTModel.from_pretrained(marian_folder).eval()
    tokenizer = MarianTokenizer.from_pretrained(marian_folder)
    _, order = run_config(marian.config, tokenizer)  # Marian's id of each of ours
    run = load_run(imported, "cpu")
    torch.set_num_threads(1)
    targets = toy_pairs("test", len(toy_test))[1]
    src, tgt = encode(run.tokenizer, toy_test), encode(run.tgt_tokenizer, targets)
    assert [[*order[s].tolist(), 0] for s in src] == tokenizer(toy_test).input_ids
    assert [[*order[t].tolist(), 0] for t in tgt] == tokenizer(text_target=targets).input_ids
    b = make_batch(src, tgt)
    with torch.no_grad():
        ours = run.model(b.src, b.tgt_in)
        theirs = marian(input_ids=order[b.src], attention_mask=b.src != PAD_ID,
                        decoder_input_ids=order[b.tgt_in]).logits  # fmt: skip
    real = b.tgt_in != PAD_ID
    tokens = order != marian.config.pad_token_id  # our <pad> and <s> are Marian's banned <pad>
    assert torch.allclose(ours[real][:, tokens], theirs[real][:, order[tokens]], atol=1e-4)
    assert (ours[real][:, ~tokens] < -1000).all()


def test_an_imported_marian_model_generates_transformers_greedy_output(
    marian_folder, imported, toy_test
):
    marian = MarianMTModel.from_pretrained(marian_folder).eval()
    _, order = run_config(marian.config, MarianTokenizer.from_pretrained(marian_folder))
    run = load_run(imported, "cpu")
    torch.set_num_threads(1)
    cfg = DecodeConfig(beam=1)
    sources = encode(run.tokenizer, toy_test[:10])
    for source, translation in zip(sources, translate_ids(run.model, sources, cfg), strict=True):
        hyp = translation.hypotheses[0]
        generated = marian.generate(
            torch.tensor([[*order[source].tolist(), 0]]), do_sample=False,
            max_new_tokens=search_limit(source, cfg, run.config.model.max_positions),
            forced_eos_token_id=None,  # tformer's search forces no </s> at the limit
        )[0, 1:].tolist()  # fmt: skip
        assert generated == [*order[hyp.tokens].tolist(), *([0] if hyp.finished else [])]


def test_an_import_is_a_run_listed_as_imported_that_translate_and_eval_use(
    marian_folder, imported, tmp_path
):
    config = RunConfig.load(imported)
    assert config.imported_from == str(marian_folder)
    assert (config.model.activation, config.model.output_bias) == ("silu", True)
    assert (config.train.src_lang, config.train.tgt_lang) == ("en", "de")
    info = collect_run(imported)
    assert (info.state, info.detail) == ("imported", f"from {marian_folder}")
    result = cli("translate", "-m", imported, "--greedy", "the dog sings .")
    assert result.exit_code == 0, result.output
    report = cli("eval", "-m", imported, "--data", "toy", "--limit", "4", "--beam", "2")
    assert report.exit_code == 0, report.output
    assert "Exposure gap in BLEU" in report.stdout and "Error accumulation" in report.stdout
    runs = tmp_path / "runs"
    result = cli("import", marian_folder, "--runs-dir", runs, "--name", "mt")
    assert result.exit_code == 0 and (runs / "mt" / "model.pt").is_file(), result.output


def toy_corpus_folder(folder: Path, n: int = 32) -> Path:
    """The first ``n`` toy pairs of each split as train/valid/test.tsv (a quarter for the last
    two): English sources, German targets."""
    folder.mkdir()
    for split, size in (("train", n), ("valid", n // 4), ("test", n // 4)):
        src, tgt = toy_pairs(split, size)
        text = "".join(f"{s}\t{t}\n" for s, t in zip(src, tgt, strict=True))
        (folder / f"{split}.tsv").write_text(text, encoding="utf-8")
    return folder


def cached_train_split(runs: Path, before: set[Path]) -> Split:
    """The training split of the one encoded cache entry under ``runs`` not in ``before``."""
    (entry,) = set(runs.glob(f"{CACHE_DIR}/encoded-*")) - before
    return read_split(entry / "train.arrow")


def test_the_api_scores_an_imports_targets_with_its_target_tokenizer(imported, toy_test):
    """``Run.score`` and ``Run.attention(target=...)`` encode targets as the model was trained
    to read them: by the target side's SentencePiece, which segments them differently here."""
    import tformer_cli as tformer

    run, loaded = tformer.load(imported, device="cpu"), load_run(imported, "cpu")
    targets = toy_pairs("test", len(toy_test))[1][:8]
    theirs, shared = encode(loaded.tgt_tokenizer, targets), encode(loaded.tokenizer, targets)
    assert theirs != shared  # else the test could not tell them apart
    scores = run.score(toy_test[:8], targets)
    assert [s.tokens for s in scores] == [
        [loaded.tokenizer.id_to_token(i) for i in [*ids, EOS_ID]] for ids in theirs
    ]
    maps = run.attention(toy_test[0], target=targets[0], align=False)
    assert maps.maps.tgt_tokens == scores[0].tokens


def test_train_init_from_fine_tunes_an_import_with_its_target_tokenizer(
    imported, tmp_path, monkeypatch
):
    corpus, runs = toy_corpus_folder(tmp_path / "toy"), tmp_path / "runs"
    decoders = []  # the tokenizers training decodes its hypotheses with (validation BLEU)
    monkeypatch.setattr(
        bookkeeping, "decode", lambda tok, ids: decoders.append(tok) or decode(tok, ids)
    )

    def tune(source: Path, name: str) -> Path:
        result = cli(
            "train", "--init-from", source, "--data", corpus, "--runs-dir", runs, "--name", name,
            "--max-steps", "1", "--device", "cpu", "--compile", "off", "--quiet",
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        return runs / name

    tuned, run = tune(imported, "tuned"), load_run(imported, "cpu")
    target = (imported / TARGET_TOKENIZER).read_bytes()
    assert (tuned / TARGET_TOKENIZER).read_bytes() == target
    assert RunConfig.load(tuned).model == RunConfig.load(imported).model  # silu, output bias
    theirs = run.tgt_tokenizer.to_str()
    assert decoders and all(t.to_str() == theirs for t in decoders), "decoded by the source's"
    split = cached_train_split(runs, set())
    src, tgt = toy_pairs("train", 32)
    assert list(split.refs) == tgt and list(split.src) == encode(run.tokenizer, src)
    assert list(split.tgt) == encode(run.tgt_tokenizer, tgt) != encode(run.tokenizer, tgt)
    result = cli("translate", "-m", tuned, "--greedy", "the dog sings .")
    assert result.exit_code == 0 and result.stdout.strip(), result.output
    shared = tmp_path / "shared"  # the import without its target tokenizer: the source's for both
    shutil.copytree(imported, shared)
    (shared / TARGET_TOKENIZER).unlink()
    before = set(runs.glob(f"{CACHE_DIR}/encoded-*"))
    assert not (tune(shared, "plain") / TARGET_TOKENIZER).exists()
    assert list(cached_train_split(runs, before).tgt) == encode(run.tokenizer, tgt)


def test_an_import_exported_again_comes_back_with_its_bias_and_target_tokenizer(imported, tmp_path):
    back = import_marian(str(export_hf(imported, tmp_path / "hf")), tmp_path / "runs", "back")
    assert RunConfig.load(back).model == RunConfig.load(imported).model  # SiLU, output bias
    ours, theirs = torch.load(imported / "model.pt"), torch.load(back / "model.pt")
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    for name in ("tokenizer.json", TARGET_TOKENIZER):
        assert (back / name).read_text() == (imported / name).read_text()


def test_what_is_not_an_importable_marian_checkpoint_is_one_line_and_writes_nothing(
    marian_folder, toy_run, tmp_path
):
    runs = tmp_path / "runs"
    assert_one_line_error(cli("import", toy_run, "--runs-dir", runs), "not a Hugging Face model")
    gelu = tmp_path / "gelu"
    MarianMTModel(MarianConfig(vocab_size=60, d_model=16, encoder_layers=1, decoder_layers=1,
                               encoder_attention_heads=2, decoder_attention_heads=2,
                               encoder_ffn_dim=16, decoder_ffn_dim=16, scale_embedding=True,
                               activation_function="gelu", pad_token_id=59,
                               decoder_start_token_id=59)).save_pretrained(gelu)  # fmt: skip
    for f in ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json"):
        (gelu / f).write_bytes((marian_folder / f).read_bytes())
    assert_one_line_error(cli("import", gelu, "--runs-dir", runs), "activation gelu")
    assert not runs.exists() or list(runs.iterdir()) == []


def test_an_unreachable_hub_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", "http://127.0.0.1:9")
    result = cli("import", "hf:Helsinki-NLP/opus-mt-de-en", "--runs-dir", tmp_path / "runs")
    assert_one_line_error(result, "cannot load Hugging Face model", "127.0.0.1:9")
    assert not (tmp_path / "runs").exists()
