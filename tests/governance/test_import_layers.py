"""Governance keeps its layers: the import-linter contracts in pyproject.toml hold on this checkout's sources.

Bottom up: wire / plan / audit / trust, consent / protocol, party, transport, driver, demo, leakage (and, inside
the party and the driver, their own layers). A module importing from a layer above its own (the client↔party
circle of the flat layout, say) breaks a contract and fails this test, whether or not `make lint` is run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import modelward

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = ("governance-layers", "governance-party-layers", "governance-driver-layers")


def test_governance_import_layers_are_kept(monkeypatch, tmp_path):
    cli = pytest.importorskip("importlinter.cli", reason="import-linter is not installed (the test extra has it)")
    src = Path(modelward.__file__).resolve().parents[1]
    if not (ROOT / "pyproject.toml").is_file() or src != ROOT / "src":
        pytest.skip(f"modelward is imported from {src}, not from this checkout's sources")
    monkeypatch.chdir(tmp_path)  # (import-linter's cache and nothing else lands here)
    rc = cli.lint_imports(config_filename=str(ROOT / "pyproject.toml"), limit_to_contracts=CONTRACTS,
                          no_cache=True, no_logo=True)
    assert rc == 0, "a governance module imports from a layer above its own: see the contract report above"
