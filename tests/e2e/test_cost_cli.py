"""`modelward cost`: the table, the plot, the CrypTen row that says why, and the layer a backend cannot run."""

from __future__ import annotations

import json


def _run(*args: str) -> int:
    """The CLI in this process (its imports are already paid for by the test session)."""
    from modelward.cli.main import main

    try:
        main(["cost", *args])
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def test_cost_cli_names_the_layer_and_keeps_the_crypten_row(tmp_path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[data]\nsource = "iris"\n[model]\narch = "mlp"\nhidden = [8]\n'
                   '[train]\nsteps = 20\neval_every = 10\n'
                   '[cost]\nbackends = ["plain", "he", "mpc", "crypten"]\nsamples = 4\nrepeats = 2\n')
    out = tmp_path / "out"
    assert _run(str(cfg), "--out", str(out)) == 0
    rows = {row["backend"]: row for row in json.loads((out / "results.json").read_text())}
    assert list(rows) == ["plain", "he", "mpc", "crypten"]
    assert rows["plain"]["status"] == "ok" and rows["plain"]["latency_sample_ms"] > 0
    for b in ("he", "mpc"):  # the zoo MLP uses ReLU: no polynomial evaluation possible, and the error says where
        assert rows[b]["status"] == "unsupported"
        assert f"UnsupportedLayer: backend {b} cannot run layer 'relu' (torch relu after 'fc1')" in rows[b]["reason"]
        assert rows[b]["latency_sample_ms"] is None  # no speed for a backend that did not run
    assert rows["crypten"]["status"] == "unavailable" and "torch" in rows["crypten"]["reason"]
    md = (out / "results.md").read_text()
    assert "| crypten | unavailable |" in md and "Seed 000 §1 claims" in md
    assert (out / "results.csv").read_text().splitlines()[0].startswith("backend,status,latency_sample_ms")
    assert (out / "latency.png").stat().st_size > 1000
    assert json.loads((out / "run.json").read_text())["info"]["dataset"] == "iris"


def test_unknown_backend_names_the_valid_choices() -> None:
    import pytest

    from modelward.core.config import validate
    from modelward.cost.run import CostConfig
    from modelward.errors import ConfigError

    with pytest.raises(ConfigError, match=r"cost.backends.*'plain'.*'crypten'"):
        validate(CostConfig, {"cost": {"backends": ["fhe"]}}, "c.toml")
