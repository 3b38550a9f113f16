"""The speedrun record of ``benchmarks/multi30k.py``, built from synthetic log records and eval
reports (no training): when validation BLEU first reached a target and to within how many
updates, the record table's row, the machine's bf16 flags, and what a run lacks."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.multi30k import (
    cpu_flags,
    first_reach,
    markdown_row,
    parse,
    record_rows,
    run_record,
    train_command,
    validations,
)
from tests.conftest import REPO

# (update, training seconds, valid BLEU): validations 400 updates apart, the last at the budget
CURVE = [(400, 190.0, 25.3), (800, 370.0, 32.1), (1200, 550.0, 35.9), (1600, 730.0, 37.2),
         (1880, 840.0, 37.9)]  # fmt: skip
SIGNATURES = {"bleu_signature": "nrefs:1|case:mixed|tok:13a", "chrf_signature": "nrefs:1|nc:6"}


def log_records(curve: list[tuple[int, float, float]]) -> list[dict[str, Any]]:
    """A log.jsonl as training writes it: loss records between validations, then the stop."""
    log: list[dict[str, Any]] = []
    for update, elapsed, bleu in curve:
        log.append({"step": update - 100, "epoch": 1, "elapsed": elapsed - 40, "loss": 3.0,
                    "lr": 1e-3, "tgt_tokens_per_s": 4000.0})  # fmt: skip
        log.append({"step": update, "epoch": 1, "elapsed": elapsed, "valid_loss": 2.0,
                    "valid_bleu": bleu})  # fmt: skip
    last = curve[-1][0] if curve else 0
    return [*log, {"step": last, "epoch": 1, "elapsed": 841.0, "stopped_by": "reached"}]


def eval_report(beam: bool = True) -> dict[str, Any]:
    def search(width: int, bleu: float, chrf: float) -> dict[str, Any]:
        return {"beam": width, "bleu": bleu, "chrf": chrf, **SIGNATURES}

    return {"greedy": search(1, 37.4, 57.3), "beam": search(5, 39.1, 58.7) if beam else None}


def record(log: list[dict[str, Any]], report: dict[str, Any] | None, **state: Any) -> dict:
    """The full record as main assembles it, around ``run_record``."""
    return {
        "date": "2026-11-28", "commit": "abc1234",
        "machine": {"cpu": "Some CPU", "cores": 2, "bf16_flags": ["AVX512-BF16"],
                    "torch": "2.13.0", "python": "3.11"},
        "preset": "multi30k-15min", "options": ["--lr", "1e-3"], "budget_minutes": 14.0,
        **run_record(log, report, state, {"train": {"seed": 7}}, target=37.0),
    }  # fmt: skip


def test_validations_are_the_log_records_with_a_bleu():
    points = validations(log_records(CURVE))
    assert [(p["update"], p["elapsed_s"], p["bleu"]) for p in points] == CURVE


def test_first_reach_is_the_first_validation_at_or_above_the_target_with_its_resolution():
    points = validations(log_records(CURVE))
    reach = first_reach(points, 37.0)
    assert reach["reached"] and (reach["update"], reach["elapsed_s"]) == (1600, 730.0)
    assert (reach["resolution_updates"], reach["resolution_s"]) == (400, 180.0)
    assert reach["before"]["update"] == 1200
    exact = first_reach(points, 35.9)  # equal to a validation's BLEU counts as reached
    assert exact["update"] == 1200
    at_first = first_reach(points, 20.0)  # crossed somewhere between the start and update 400
    assert (at_first["update"], at_first["resolution_updates"]) == (400, 400)
    assert at_first["before"]["bleu"] is None


def test_a_target_never_reached_gives_the_best_bleu():
    points = validations(log_records(CURVE))
    assert first_reach(points, 40.0) == {
        "target": 40.0, "reached": False, "best": 37.9, "validations": 5}  # fmt: skip
    assert first_reach([], 40.0)["best"] is None


def test_the_markdown_row_fills_the_record_table_of_results_md():
    row = markdown_row(record(log_records(CURVE), eval_report(), tgt_tokens=123456))
    cells = [c.strip() for c in row.strip("|").split(" | ")]
    assert cells == [
        "2026-11-28", "`abc1234`", "Some CPU, 2 cores, AVX512-BF16", "`multi30k-15min --lr 1e-3`",
        "14 min", "7", "1,880", "39.10", "58.70",
    ]  # fmt: skip
    docs = (REPO / "docs" / "results.md").read_text(encoding="utf-8")
    header = docs.split("## Speedrun records", 1)[1].split("\n| ", 1)[1].split("\n", 1)[0]
    assert header.count(" | ") == row.count(" | "), "the row and the table's columns agree"


def test_missing_data_reads_n_a():
    """No beam search in the report, no report, no validation, no token count: n/a, no error."""
    for report in (eval_report(beam=False), None):
        r = record(log_records([]), report)
        assert markdown_row(r).endswith("| 0 | n/a | n/a |")
        rows = dict(record_rows(r))
        assert rows["updates, target tokens seen"] == "0, n/a"
        assert rows["valid BLEU >= 37 first"] == "not reached (best n/a in 0 validations)"
    assert dict(record_rows(r))["BLEU signature"] == "n/a"
    no_beam = dict(record_rows(record(log_records(CURVE), eval_report(beam=False))))
    assert no_beam["test2016 BLEU greedy / beam 5"] == "37.40 / n/a"
    assert no_beam["BLEU signature"] == SIGNATURES["bleu_signature"]


def test_record_rows_list_every_validation_and_the_first_reach():
    rows = dict(record_rows(record(log_records(CURVE), eval_report(), tgt_tokens=123456)))
    assert rows["updates, target tokens seen"] == "1,880, 123,456"
    assert rows["validation 5"] == "update 1,880, 14.0 min, BLEU 37.90"
    assert rows["valid BLEU >= 37 first"].startswith("update 1,600, 12.2 min, BLEU 37.20;")
    assert "resolution 400 updates (3.0 min): after update 1,200" in rows["valid BLEU >= 37 first"]


@pytest.mark.parametrize(
    ("flags", "found"),
    [("fpu avx512f avx512_bf16 amx_bf16 amx_tile", ["AMX-BF16", "AVX512-BF16"]),
     ("fpu avx512f avx512_bf16", ["AVX512-BF16"]), ("fpu avx2", [])],
)  # fmt: skip
def test_cpu_flags_name_amx_and_avx512_bf16(flags: str, found: list[str]):
    cpuinfo = f"processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: {flags}\n\nflags\t: amx_bf16\n"
    assert cpu_flags(cpuinfo) == found
    assert cpu_flags("processor\t: 0\n") == []


def test_seed_goes_to_tformer_train_only_when_given(tmp_path):
    args, extra = parse(["--seed", "7", "--target", "37", "--", "--lr", "1e-3"])
    cmd = train_command("tformer", args, extra)
    assert cmd[cmd.index("--seed") + 1] == "7" and cmd[-2:] == ["--lr", "1e-3"]
    assert args.target == 37.0
    assert "--seed" not in train_command("tformer", *parse([]))
    with pytest.raises(SystemExit) as usage:
        parse(["--json", str(tmp_path / "missing" / "record.json")])
    assert usage.value.code == 2
