import csv
import dataclasses
import json
import math

import pytest

from modelward.core.records import atomic_write_json, atomic_write_text, markdown_table, write_table
from modelward.core.stats import Summary, mean_sd_text, summarize


def test_write_table_writes_three_consistent_files(tmp_path) -> None:
    rows = [{"model": "a", "acc": 0.123456, "n": 3}, {"model": "b", "acc": float("nan"), "n": 1, "extra": 1}]
    paths = write_table(tmp_path / "out", "scores", rows, ["model", "acc", "n"], title="Scores", notes=["note 1"])
    assert {p.name for p in paths.values()} == {"scores.csv", "scores.md", "scores.json"}
    with open(paths["csv"], newline="") as f:
        got = list(csv.DictReader(f))
    assert got[0] == {"model": "a", "acc": "0.123456", "n": "3"}  # full precision, extra keys dropped
    assert paths["md"].read_text() == ("# Scores\n\n| model | acc | n |\n|---|---|---|\n| a | 0.1235 | 3 |\n"
                                       "| b | nan | 1 |\n\nnote 1\n")
    data = json.loads(paths["json"].read_text())
    assert data[1] == {"model": "b", "acc": None, "n": 1}  # strict JSON: NaN -> null
    assert not list((tmp_path / "out").glob("*.tmp"))


def test_write_table_accepts_a_custom_markdown_body(tmp_path) -> None:
    paths = write_table(tmp_path, "t", [{"x": 1}], markdown="# pivot\n")
    assert paths["md"].read_text() == "# pivot\n"


def test_markdown_table_formats_and_missing_cells() -> None:
    md = markdown_table([{"a": 1.0, "b": None}, {"a": 2}], float_digits=2)
    assert md.splitlines() == ["| a | b |", "|---|---|", "| 1.00 | — |", "| 2 | — |"]


def test_atomic_writers_replace_whole_files(tmp_path) -> None:
    p = atomic_write_text(tmp_path / "d" / "f.txt", "one")
    atomic_write_text(p, "two")
    assert p.read_text() == "two"
    q = atomic_write_json(tmp_path / "x.json", {"v": [1.5, float("inf")]})
    assert json.loads(q.read_text()) == {"v": [1.5, None]}


def test_summarize_matches_the_definitions() -> None:
    s = summarize([3.0, 1.0, 2.0, 10.0])
    assert (s.median, s.mean, s.min, s.max, s.n) == (2.5, 4.0, 1.0, 10.0, 4)
    assert s.sd == pytest.approx(math.sqrt(((3 - 4) ** 2 + 9 + 4 + 36) / 3))  # n - 1
    one = summarize([0.7])
    assert one.mean == 0.7 and math.isnan(one.sd)
    none = summarize([])
    assert none.n == 0 and math.isnan(none.mean)
    assert summarize([1.0, None, float("nan"), 3.0], skip_missing=True).mean == 2.0
    assert list(s.as_dict("acc_")) == ["acc_median", "acc_mean", "acc_sd", "acc_min", "acc_max", "acc_n"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Summary(1, 1, 1, 1, 1, 1).n = 2  # frozen


def test_mean_sd_text() -> None:
    assert mean_sd_text([0.4, 0.5, 0.6]) == "0.50 ± 0.10"
    assert mean_sd_text([0.4]) == "0.40"
    assert mean_sd_text([0.1, 0.2], scale=100, unit="%", sd_digits=1) == "15.00% ± 7.1"
    assert mean_sd_text([]) == "—"
