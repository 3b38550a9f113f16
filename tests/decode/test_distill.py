"""``tformer distill``: a teacher's translations of a corpus's training split, as a corpus that
``tformer train`` reads; the valid and test splits the originals; chunks written whole, so a
stopped run resumes to the corpus of one that never stopped; a full disk and bad input as one
line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tests.training.test_storage import file_size_limit
from tformer_cli.checkpoint import RunConfig, atomic_torch_save
from tformer_cli.cli import app
from tformer_cli.data.corpus import load_corpus
from tformer_cli.data.tokenizer import EOS_ID
from tformer_cli.decode import distill as distilling
from tformer_cli.errors import TformerError
from tformer_cli.files import file_sha256
from tformer_cli.model import Transformer

runner = CliRunner()
CPU = ["--device", "cpu", "--precision", "fp32", "--compile", "off", "--threads", "1"]
DISTILL = ["-k", "2", "--alpha", "0.6", "--max-tokens", "64"]


@pytest.fixture
def teacher(tmp_path: Path, make_run) -> Path:
    """An untrained run that writes only words (an output bias of -30 on ``<pad>``, ``<unk>``,
    ``<s>`` and ``</s>``): every translation runs to the length limit, none is empty."""
    run_dir, _ = make_run(tmp_path / "teacher")
    config = RunConfig.load(run_dir)
    model = Transformer(dataclasses.replace(config.model, output_bias=True))
    model.load_state_dict(torch.load(run_dir / "model.pt"), strict=False)
    with torch.no_grad():
        model.generator.bias[: EOS_ID + 1] = -30.0
    RunConfig(model.cfg, config.train).save(run_dir)
    atomic_torch_save(run_dir / "model.pt", model.state_dict())
    return run_dir


def distill(*args: str | Path) -> object:
    result = runner.invoke(app, ["distill", *CPU, *map(str, args)])
    assert "Traceback" not in result.output, result.output
    return result


def pairs(folder: Path) -> dict[str, list[tuple[str, str]]]:
    corpus = load_corpus(folder, carve=False)
    return {name: list(zip(ds["src"], ds["tgt"], strict=True)) for name, ds in corpus.items()}


def test_the_corpus_is_translate_s_output_on_the_training_split(teacher, tiny_corpus, tmp_path):
    out = tmp_path / "student-data"
    result = distill(
        "-m", teacher, "--data", tiny_corpus, *DISTILL, "--chunk-size", "16", "-o", out
    )
    assert result.exit_code == 0, result.output
    original, distilled = pairs(tiny_corpus), pairs(out)
    assert distilled["valid"] == original["valid"] and distilled["test"] == original["test"]
    sources = [src for src, _ in original["train"]]
    assert [src for src, _ in distilled["train"]] == sources
    translated = runner.invoke(
        app, ["translate", "-m", str(teacher), *CPU, "-k", "2", "--alpha", "0.6", *sources]
    )
    assert translated.exit_code == 0, translated.output
    assert [tgt for _, tgt in distilled["train"]] == translated.stdout.splitlines()
    record = json.loads((out / "distill.json").read_text(encoding="utf-8"))
    assert record["teacher"] == str(teacher.resolve())
    assert record["teacher_sha256"] == file_sha256(teacher / "model.pt")
    assert (record["beam"], record["alpha"], record["engine"], record["precision"]) == (
        2, 0.6, "torch", "fp32"
    )  # fmt: skip
    assert record["distilled"] == len(sources) and record["empty"] == 0
    assert not (out / distilling.CHUNKS).exists()


@pytest.mark.parametrize("where", [["--precision", "int8"], ["--engine", "ctranslate2"]])
def test_int8_and_ctranslate2_teachers_translate_as_translate_does(
    where, teacher, tiny_corpus, tmp_path
):
    if where[1] == "ctranslate2":
        pytest.importorskip("ctranslate2")
    out = tmp_path / where[1]
    assert (
        distill("-m", teacher, "--data", tiny_corpus, "-k", "2", *where, "-o", out).exit_code == 0
    )
    train = pairs(out)["train"]
    sources = [src for src, _ in train]
    translated = runner.invoke(
        app, ["translate", "-m", str(teacher), *CPU, "-k", "2", *where, *sources]
    )
    assert [tgt for _, tgt in train] == translated.stdout.splitlines()
    record = json.loads((out / "distill.json").read_text(encoding="utf-8"))
    assert record[where[0].removeprefix("--")] == where[1]


def test_mix_keeps_the_originals_and_limit_takes_the_first_pairs(teacher, tiny_corpus, tmp_path):
    out = tmp_path / "mixed"
    result = distill(
        "-m", teacher, "--data", tiny_corpus, *DISTILL, "--mix", "--limit", "5", "-o", out
    )
    assert result.exit_code == 0, result.output
    train, original = pairs(out)["train"], pairs(tiny_corpus)["train"][:5]
    assert train[5:] == original and [s for s, _ in train[:5]] == [s for s, _ in original]


def test_a_stopped_distillation_resumes_to_the_same_corpus(
    teacher, tiny_corpus, tmp_path, monkeypatch
):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    args = ["-m", teacher, "--data", tiny_corpus, *DISTILL, "--chunk-size", "16"]
    assert distill(*args, "-o", straight).exit_code == 0
    write_lines, written = distilling.write_lines, []

    def stops_after_one_chunk(path: Path, lines) -> None:
        if path.parent.name == distilling.CHUNKS and written:
            raise KeyboardInterrupt
        written.append(path)
        write_lines(path, lines)

    monkeypatch.setattr(distilling, "write_lines", stops_after_one_chunk)
    assert distill(*args, "-o", resumed).exit_code == 130
    assert [p.name for p in (resumed / distilling.CHUNKS).glob("*.jsonl")] == ["000000.jsonl"]
    monkeypatch.setattr(distilling, "write_lines", write_lines)
    other = distill(*args, "-k", "3", "-o", resumed)  # the last -k counts
    assert other.exit_code == 1 and "other settings: --force starts over" in other.stderr
    translated: list[str] = []
    chunks = distilling.translate_chunks

    def counted(runs, sources, *args, **kwargs):
        translated.extend(sources)
        return chunks(runs, translated[:], *args, **kwargs)

    monkeypatch.setattr(distilling, "translate_chunks", counted)
    assert distill(*args, "-o", resumed).exit_code == 0
    assert len(translated) == 40 - 16  # the first chunk was not translated again
    for name in ("train.jsonl", "valid.jsonl", "test.jsonl"):
        assert (resumed / name).read_bytes() == (straight / name).read_bytes()
    record = json.loads((resumed / "distill.json").read_text(encoding="utf-8"))
    assert record == json.loads((straight / "distill.json").read_text(encoding="utf-8"))


def test_a_full_disk_is_one_line_naming_the_chunk(teacher, tiny_corpus, tmp_path):
    out = tmp_path / "full"
    from tformer_cli.checkpoint import load_runs
    from tformer_cli.config import DecodeConfig
    from tformer_cli.decode.translate import Batching

    runs = load_runs([teacher], "cpu", "fp32", "off")
    teacher_ = distilling.Teacher(runs, DecodeConfig(beam=1), Batching(64), "torch", "fp32")
    corpus = load_corpus(tiny_corpus)
    with file_size_limit(1000), pytest.raises(TformerError) as failed:
        distilling.distill_corpus(teacher_, corpus, out, data="tiny", chunk_size=16)
    message = str(failed.value)
    assert message.startswith(f"cannot write {out / distilling.CHUNKS / '000000.jsonl'}: File")
    assert "\n" not in message
    assert not list((out / distilling.CHUNKS).glob("*.tmp")) and not list(out.glob("*.jsonl"))


def test_bad_input_is_one_line(teacher, tiny_corpus, tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x\n", encoding="utf-8")
    done = tmp_path / "done"
    assert (
        distill(
            "-m", teacher, "--data", tiny_corpus, *DISTILL, "--limit", "2", "-o", done
        ).exit_code
        == 0
    )
    other = tmp_path / "other"
    other.mkdir()
    (other / "train.tsv").write_text("a\tb\n", encoding="utf-8")
    cases = [
        (["-m", tmp_path / "no-run", "-o", tmp_path / "x"], "no-run"),
        (["-m", teacher, "--data", tmp_path / "no-data", "-o", tmp_path / "y"], "no-data"),
        (["-m", teacher, "-o", a_file], "is a file"),
        (["-m", teacher, "--data", tiny_corpus, "-o", done], "--force"),
        (["-m", teacher, "--data", tiny_corpus, "-o", other], "holds other files"),
    ]
    for args, said in cases:
        result = distill(*args)
        assert result.exit_code == 1, result.output
        assert said in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    forced = distill(
        "-m", teacher, "--data", tiny_corpus, *DISTILL, "--limit", "3", "--force", "-o", done
    )
    assert forced.exit_code == 0 and len(pairs(done)["train"]) == 3


def test_a_student_trains_on_the_distilled_corpus(teacher, tiny_corpus, tmp_path):
    out = tmp_path / "student-data"
    assert distill("-m", teacher, "--data", tiny_corpus, *DISTILL, "-o", out).exit_code == 0
    tiny = [
        "--d-model",
        "16",
        "--heads",
        "2",
        "--d-ff",
        "32",
        "--layers",
        "1",
        "--vocab-size",
        "60",
    ]
    result = runner.invoke(
        app,
        ["train", "--data", str(out), "--max-steps", "2", "--device", "cpu", *tiny,
         "--runs-dir", str(tmp_path / "runs"), "--name", "student", "--valid-every", "2",
         "--valid-bleu-size", "2", "--quiet"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "runs" / "student" / "config.json").read_text(encoding="utf-8"))
    assert config["train"]["data"] == str(out.resolve())  # its provenance: out/distill.json


def test_an_empty_translation_is_left_out_and_counted(make_run, tiny_corpus, tmp_path):
    """An untrained run ends most sentences at once: no corpus takes an empty target."""
    run_dir, _ = make_run(tmp_path / "untrained")
    out = tmp_path / "out"
    assert distill("-m", run_dir, "--data", tiny_corpus, *DISTILL, "-o", out).exit_code == 0
    record = json.loads((out / "distill.json").read_text(encoding="utf-8"))
    train = pairs(out)["train"]
    assert record["empty"] > 0 and record["distilled"] + record["empty"] == 40
    assert len(train) == record["distilled"] and all(tgt.strip() for _, tgt in train)
