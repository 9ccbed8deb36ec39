"""`--set` overrides: nested tables and arrays of tables (UAT: `--set procedures.0.kind=T3` was refused)."""

import pytest

from modelward.core.config import apply_overrides
from modelward.errors import ConfigError


def _data():
    return {"train": {"steps": 600}, "procedures": [{"name": "T1", "kind": "T1"}, {"name": "T2", "kind": "T2"}],
            "seeds": [0, 1, 2]}


def test_nested_table_and_new_keys():
    d = apply_overrides(_data(), ["train.steps=20", "retrain.lr=0.1"])
    assert d["train"]["steps"] == 20 and d["retrain"] == {"lr": 0.1}


def test_array_of_tables_by_index():
    d = apply_overrides(_data(), ["procedures.1.kind=T3", "seeds.0=7"])
    assert d["procedures"][1] == {"name": "T2", "kind": "T3"} and d["seeds"] == [7, 1, 2]


@pytest.mark.parametrize(("item", "msg"), [("procedures.5.kind=T3", "index 0..1"),
                                           ("procedures.kind=T3", "e.g. procedures.0.kind"),
                                           ("train.steps.x=1", "is a value, not a table")])
def test_bad_paths_are_named(item, msg):
    with pytest.raises(ConfigError, match=msg):
        apply_overrides(_data(), [item])
