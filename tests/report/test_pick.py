"""Tests for tformer_cli.report.pick: the run a command uses, given one or none."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tformer_cli.checkpoint import RunConfig
from tformer_cli.errors import TformerError
from tformer_cli.report.pick import choose_run, default_note, default_run
from tformer_cli.report.runs import RunLock, list_runs

STOPPED = '{"step": 1, "loss": 1.0}\n{"step": 1, "stopped_by": "reached --max-steps 1"}\n'


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "runs"
    folder.mkdir()
    return folder


def finished(make_run, run_dir: Path) -> Path:
    """A complete run whose log says it stopped by its rule."""
    make_run(run_dir)
    (run_dir / "log.jsonl").write_text(STOPPED, encoding="utf-8")
    return run_dir


def newest_first(runs_dir: Path, names: list[str]) -> None:
    """Date the runs' files an hour apart, ``names[0]`` the newest."""
    for age, name in enumerate(names):
        for f in [runs_dir / name, *(runs_dir / name).iterdir()]:
            os.utime(f, (time.time() - 3600 * age,) * 2)


def test_the_newest_usable_run_is_used_and_the_newer_ones_passed_over_are_named(runs_dir, make_run):
    done = finished(make_run, runs_dir / "done")
    make_run(runs_dir / "cut")  # no log: interrupted, with a model.pt
    make_run(runs_dir / "early")
    (runs_dir / "early" / "model.pt").unlink()  # interrupted before its first model.pt
    (runs_dir / "junk").mkdir()  # broken
    with RunLock(runs_dir / "live"):
        RunConfig.load(done).save(runs_dir / "live")
        newest_first(runs_dir, ["live", "junk", "early", "cut", "done"])
        chosen, passed = default_run(runs_dir)
        marked = [r.name for r in list_runs(runs_dir) if r.default]
        (runs_dir / "junk2").mkdir()  # a fourth newer run: three named, then ...
        os.utime(runs_dir / "junk2", (time.time() + 60,) * 2)
        longer = default_note(*default_run(runs_dir))
    assert (chosen.name, chosen.state) == ("cut", "interrupted")
    assert marked == ["cut"]  # what tformer runs marks
    assert [(r.name, r.state) for r in passed] == [
        ("live", "running"), ("junk", "broken"), ("early", "interrupted")
    ]  # fmt: skip
    assert default_note(chosen, passed) == (
        f"using run {runs_dir / 'cut'} (interrupted, newest usable; newer: live running, junk"
        " broken, early interrupted; -m to choose)"
    )
    assert "newer: junk2 broken, live running, junk broken, ...;" in longer


def test_the_newest_finished_run_is_said_plainly(runs_dir, make_run):
    finished(make_run, runs_dir / "old")
    new = finished(make_run, runs_dir / "new")
    newest_first(runs_dir, ["new", "old"])
    chosen, passed = default_run(runs_dir)
    assert default_note(chosen, passed) == f"using run {new} (finished, newest; -m to choose)"


def test_without_a_usable_run_the_error_says_what_there_is(tmp_path, runs_dir):
    for folder in (tmp_path / "nowhere", runs_dir):
        with pytest.raises(TformerError, match=r"no trained run under .*: run `tformer train`"):
            default_run(folder)
    (runs_dir / "junk").mkdir()
    with pytest.raises(TformerError, match=r"\(junk broken: see tformer runs\)"):
        default_run(runs_dir)


def test_choose_run_resolves_a_name_or_picks_the_default(runs_dir, make_run):
    done = finished(make_run, runs_dir / "toy-20261126-093738")
    assert choose_run(Path("toy"), runs_dir) == done  # train's stamped name answers to its data
    assert choose_run(None, runs_dir) == done
    with pytest.raises(TformerError, match="does not exist"):
        choose_run(Path("nope"), runs_dir)
