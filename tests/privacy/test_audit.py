"""The audit plan and user data files (CSV / npz written here) through the audit's data path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from modelward.core.config import validate
from modelward.errors import ConfigError
from modelward.privacy.audit import AuditConfig, _pooled, plan_runs, proxy_needs


def test_plan_has_shared_shadow_and_proxy_runs() -> None:
    cfg = validate(AuditConfig, {"repetitions": 2, "attacks": [
        {"name": "naive"}, {"name": "lira"}, {"name": "bayesian_wb", "params": {"proxies": 4}},
        {"name": "nn_wb", "label": "nnwb"}]})
    plan = {p.run_id: p for p in plan_runs(cfg)}
    assert set(plan) >= {"target|1", "shadows|1", "proxies|1", "attack|nnwb|1"}
    assert plan["attack|lira|0"].depends_on == ("target|0", "shadows|0", "proxies|0")
    assert plan["proxies|0"].depends_on == ("target|0",)
    assert proxy_needs(cfg) == [(1, False), (4, True)]
    assert "out" not in plan["target|0"].spec  # a moved study folder still resumes


def test_bad_attack_specs_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="valid choices"):
        validate(AuditConfig, {"attacks": [{"name": "mia"}]})
    with pytest.raises(ConfigError, match="duplicate"):
        validate(AuditConfig, {"attacks": [{"name": "naive"}, {"name": "naive"}]})
    with pytest.raises(ConfigError, match="target_epsilon"):
        validate(AuditConfig, {"defense": {"kind": "dp"}})


@pytest.mark.parametrize("kind", ["csv", "npz"])
def test_user_files_feed_the_audit(tmp_path: Path, kind: str) -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(60, 4)), rng.integers(0, 3, 60)
    if kind == "csv":
        path = tmp_path / "d.csv"
        rows = ["a,b,c,d,label"] + [",".join(f"{v:.5f}" for v in r) + f",c{t}" for r, t in zip(x, y, strict=True)]
        path.write_text("\n".join(rows) + "\n")
        data = {"source": "csv", "path": str(path), "label_column": "label"}
    else:
        path = tmp_path / "d.npz"
        np.savez(path, x=x.astype(np.float32), y=y)
        data = {"source": "npz", "path": str(path)}
    cfg = validate(AuditConfig, {"data": data, "attacks": [{"name": "naive"}]})
    xs, ys, classes, shape = _pooled(cfg)
    assert xs.shape == (60, 4) and classes == 3 and shape == (4,) and set(ys.tolist()) == {0, 1, 2}
