"""``tformer eval`` on a full disk (a file-size limit, ``RLIMIT_FSIZE``, as in
tests/training/test_storage.py): ``-o FILE`` is one line naming it, the run's stored result is
a note (the score still stands), nothing half written is left, and the same command with room to
write writes both."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.training.test_storage import file_size_limit
from tformer_cli.cli import app, err
from tformer_cli.report import eval_run
from tformer_cli.report.request import read_stored_eval


def test_eval_o_to_a_full_disk_is_one_line_and_a_rerun_writes_the_report(
    tmp_path: Path, make_run, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("TFORMER_THREADS", "1")
    monkeypatch.delenv("TFORMER_DEBUG", raising=False)
    monkeypatch.setattr(err, "_width", 1000, raising=False)
    run_dir, _ = make_run(tmp_path / "run")
    (tmp_path / "src.txt").write_text("a b c\nd e\n", encoding="utf-8")
    (tmp_path / "tgt.txt").write_text("c b a\ne d\n", encoding="utf-8")
    report = tmp_path / "report.json"
    args = ["eval", "-m", str(run_dir), "--src-file", str(tmp_path / "src.txt"),
            "--tgt-file", str(tmp_path / "tgt.txt"), "--beam", "1", "--json", "-o", str(report),
            "--device", "cpu", "-q"]  # fmt: skip
    runner = CliRunner()

    def full(write):  # the disk fills once the score is made
        def written(*args, **kwargs):
            with file_size_limit(0):
                return write(*args, **kwargs)

        return written

    with monkeypatch.context() as m:
        m.setattr(eval_run, "atomic_write_text", full(eval_run.atomic_write_text))
        m.setattr(eval_run, "keep_eval", full(eval_run.keep_eval))
        failed = runner.invoke(app, args)
    assert failed.exit_code == 1 and "Traceback" not in failed.output
    assert failed.stderr.splitlines() == [
        f"Error: cannot write {report}: File too large (free some space or lift the limit,"
        " then run the command again)"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "src.txt", "tgt.txt"]
    assert not [p for p in (run_dir / "evals").rglob("*") if p.is_file()]

    done = runner.invoke(app, args)
    assert done.exit_code == 0, done.output
    assert report.is_file()
    (kept,) = (run_dir / "evals").iterdir()
    assert read_stored_eval(kept) is not None
