"""The served audit's config and the guard config it derives (no server here; tests/e2e starts one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelward.core.config import read_toml, validate
from modelward.core.zoo import ModelConfig
from modelward.errors import ConfigError
from modelward.privacy.served import (
    ServedAuditConfig,
    ServedDefense,
    guard_config_for,
    pivot,
    run_served_audit,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_bad_defense_or_attack_names_the_choices() -> None:
    with pytest.raises(ConfigError, match="modelguard_w"):
        validate(ServedAuditConfig, {"defenses": [{"name": "modelgaurd_w"}]})
    with pytest.raises(ConfigError, match="knockoff"):
        validate(ServedAuditConfig, {"attacks": ["lira"]})
    with pytest.raises(ConfigError, match="distinct"):
        validate(ServedAuditConfig, {"defenses": [{"name": "top1"}, {"name": "top1"}]})


def test_derived_guard_config_never_carries_the_owners_keys(tmp_path: Path) -> None:
    guard = read_toml(EXAMPLES / "guard_modelguard_w.toml")
    path = guard_config_for(guard, tmp_path / "g", tmp_path / "t.safetensors", ModelConfig(arch="mlp", hidden=[8]),
                            (1, 8, 8), 10, ServedDefense(name="top1"), "audit-key")
    cfg = read_toml(path)
    assert cfg["keys"] == [{"name": "privacy-audit", "key": "audit-key"}]  # unlimited, the audit's own
    assert cfg["defense"] == {"name": "top1", "params": {}}
    assert cfg["server"]["host"] == "127.0.0.1" and "port" not in cfg["server"]
    assert cfg["server"]["max_batch"] == guard["server"]["max_batch"]  # the owner's server limits are kept
    assert cfg["server"]["state_dir"].startswith(str(tmp_path))  # the owner's query log is not touched


def test_not_a_guard_toml_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "x.toml"
    bad.write_text('name = "x"\n')
    with pytest.raises(ConfigError, match="GUARD.toml"):
        run_served_audit(ServedAuditConfig(), bad, tmp_path / "o")


def test_pivot_table() -> None:
    rows = [{"defense": "none", "served_accuracy": 0.9, "attack": "loss", "tpr_at_1pct_fpr": 0.05, "epsilon_lb": 1.2},
            {"defense": "none", "served_accuracy": 0.9, "attack": "knockoff", "accuracy": 0.8}]
    md = pivot(rows, ["loss", "knockoff"])
    assert "| none | 0.900 | 0.050 (1.20) | 0.800 |" in md
