import csv
import json

from modelward.core.records import atomic_write_json, atomic_write_text, markdown_table, write_table


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


def test_small_numbers_keep_their_significant_digits(tmp_path) -> None:
    """Issue 38 item 7: results.md printed δ = 1e-5 as 0.0000."""
    from modelward.core.records import write_table

    paths = write_table(tmp_path, "t", [{"delta": 1e-5, "epsilon": 0.5, "zero": 0.0, "tiny": -2.5e-7}])
    md = paths["md"].read_text()
    assert "| 1e-05 | 0.5000 | 0.0000 | -2.5e-07 |" in md
