"""The extraction evaluation harness: cells, worst-case layout, resume through the ledger, config errors."""

from __future__ import annotations

import csv
import math

import pytest
import torch

from modelward.core.config import validate
from modelward.errors import ConfigError, LedgerError
from modelward.extraction import study as ev
from modelward.extraction.config import ExtractionConfig, cells
from modelward.extraction.study import run_evaluation


def _cfg(tmp_path, **over):
    data = {
        "name": "tiny", "budget": 120, "seeds": [0],
        "data": {"source": "digits", "test_fraction": 0.25, "max_samples": 700},
        "victim": {"model": {"arch": "mlp", "hidden": [24]}, "train": {"steps": 120, "lr": 0.1},
                   "temperature": 2.0, "cache_dir": str(tmp_path / "cache")},
        "substitute": {"epochs": 3, "lr": 0.1},
        "defenses": [{"name": "none"}, {"name": "rounding"}, {"name": "reverse_sigmoid", "label": "revsig",
                                                              "params": {"beta": 0.3, "gamma": 0.2}}],
        "attacks": [{"strategy": "naive"}, {"strategy": "top1"}],
    }
    data.update(over)
    return validate(ExtractionConfig, data, "test")


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_results_layout_and_worst_case(tmp_path):
    cfg = _cfg(tmp_path)
    summary = run_evaluation(cfg, tmp_path / "run")
    out = tmp_path / "run"
    rows = _read(out / "results.csv")
    assert len(rows) == len(cells(cfg)) == 6
    assert {r["defense"] for r in rows} == {"none", "rounding", "revsig"}
    for r in rows:
        assert 0.0 <= float(r["accuracy"]) <= 1.0 and 0.0 <= float(r["fidelity"]) <= 1.0
        assert int(r["queries_used"]) == 120
    none = [r for r in rows if r["defense"] == "none"]
    assert all(float(r["max_l1"]) < 1e-5 for r in none)
    revsig = [r for r in rows if r["defense"] == "revsig"]
    assert all(float(r["max_l1"]) > 0.05 for r in revsig)
    # top-1-preserving defenses keep the protected accuracy; Top-1 attack equal across them (same hard labels)
    prot = {r["defense"]: float(r["protected_accuracy"]) for r in rows}
    assert prot["none"] == prot["revsig"] == pytest.approx(summary["victim_accuracy"])
    top1 = {r["defense"]: float(r["accuracy"]) for r in rows if r["strategy"] == "top1"}
    assert top1["none"] == top1["revsig"]
    wc = {r["defense"]: r for r in _read(out / "worst_case.csv")}
    for d in ("none", "rounding", "revsig"):
        accs = {r["attack"]: float(r["accuracy"]) for r in rows if r["defense"] == d}
        assert float(wc[d]["max_accuracy"]) == pytest.approx(max(accs.values()))
        assert wc[d]["worst_attack"] == max(accs, key=accs.get)
    md = (out / "results.md").read_text()
    assert "| Attack | none | rounding | revsig |" in md and "**Max accuracy of w_s**" in md
    assert "Protected accuracy of w_t" in md and "Max ℓ1 distortion" in md
    assert (out / "config.json").is_file()


def test_resume_keeps_finished_cells_and_victim_cache(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path)
    real = ev.run_cell
    calls = []

    def dying(cfg_, prep, cell, workdir):
        if len(calls) == 2:
            raise KeyboardInterrupt  # as if the process were interrupted
        calls.append(cell.run_id)
        return real(cfg_, prep, cell, workdir)

    monkeypatch.setattr(ev, "run_cell", dying)
    with pytest.raises(KeyboardInterrupt):
        run_evaluation(cfg, tmp_path / "run")
    from modelward.core.ledger import RunLedger

    first = RunLedger(tmp_path / "run" / "ledger.sqlite").results()
    assert len(first) == 2
    again = []

    def counting(cfg_, prep, cell, workdir):
        again.append(cell.run_id)
        assert prep.cached  # the victim is loaded from the per-config cache, not retrained
        return real(cfg_, prep, cell, workdir)

    monkeypatch.setattr(ev, "run_cell", counting)
    run_evaluation(cfg, tmp_path / "run")
    assert len(again) == 4 and not set(again) & set(first)
    final = RunLedger(tmp_path / "run" / "ledger.sqlite").results()
    assert len(final) == 6 and all(final[k] == first[k] for k in first)
    again.clear()
    run_evaluation(cfg, tmp_path / "run")  # nothing left to do
    assert again == []


def test_other_config_in_same_folder_is_refused(tmp_path):
    run_evaluation(_cfg(tmp_path, attacks=[{"strategy": "top1"}], defenses=[{"name": "none"}]), tmp_path / "run")
    with pytest.raises(LedgerError, match="different"):
        run_evaluation(_cfg(tmp_path, budget=100, attacks=[{"strategy": "top1"}], defenses=[{"name": "none"}]),
                       tmp_path / "run")


@pytest.mark.parametrize("over, field, hint", [
    ({"defenses": [{"name": "modelgard_s"}]}, "defenses.0", "modelguard_s"),
    ({"attacks": [{"strategy": "bayes"}]}, "attacks.0", "pbayes"),
    ({"attacks": [{"query": "random"}]}, "attacks.0", "knockoff"),
    ({"defenses": [{"name": "modelguard_w", "epsilons": [3.0]}]}, "defenses.0", "[0, 2]"),
    ({"budget": 0}, "budget", "greater than or equal"),
    ({"attacks": [{"strategy": "naive"}, {"strategy": "naive"}]}, "<root>", "label"),
    ({"transfer": {"source": "data"}}, "transfer", "transfer.data"),
    ({"victim": {"temprature": 2.0}}, "victim.temprature", "unknown field"),
    ({"defenses": [{"name": "rounding", "params": {"decimal": 2}}]}, "defenses.0", "valid: ['decimals']"),
    ({"attacks": [{"strategy": "pbayes", "strategy_params": {"K": 5}}]}, "attacks.0", "'precision_factor'"),
    ({"attacks": [{"query": "jbda", "query_params": {"seed": 5}}]}, "attacks.0", "'seed_size'"),
])
def test_bad_configs_name_the_field(tmp_path, over, field, hint):
    with pytest.raises(ConfigError) as e:
        _cfg(tmp_path, **over)
    assert f"field '{field}'" in str(e.value) and hint in str(e.value)


def test_budget_larger_than_pool_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="budget"):
        run_evaluation(_cfg(tmp_path, budget=5000), tmp_path / "run")


def test_noise_transfer_and_epsilon_sweep_plot(tmp_path):
    cfg = _cfg(tmp_path, transfer={"source": "noise", "size": 150},
               defenses=[{"name": "reverse_sigmoid", "params": {"gamma": 0.2}, "epsilons": []},
                         {"name": "rounding"}],
               attacks=[{"strategy": "naive"}])
    run_evaluation(cfg, tmp_path / "run")
    rows = _read(tmp_path / "run" / "results.csv")
    assert len(rows) == 2 and all(not math.isnan(float(r["accuracy"])) for r in rows)


@pytest.mark.parametrize("name", ["extraction_digits.toml", "extraction_manyclass.toml"])
def test_example_configs_load(name):
    from pathlib import Path

    from modelward.core.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[2] / "examples" / name, ExtractionConfig)
    cs = cells(cfg)
    keys = {c.defense_key for c in cs}
    assert {"none", "mg_s@1", "mg_w@1", "mg_s@0.5", "mg_s@1.5"} <= keys
    sweep = {c.attack.key for c in cs if c.defense_key == "mg_s@0.5"}
    assert sweep == {"knockoff/naive", "knockoff/pbayes"}
    assert len({c.run_id for c in cs}) == len(cs)
