"""What `modelward assess` does once before its sections: scan the model file, load the model and data, check the
model against its own record, and write what the report and the reproduce commands need.

- ``supply_chain.json``: the model-file scan (:mod:`modelward.scan`) and its findings (OWASP ML06);
- ``target.json``: the model's description, its clean test accuracy, how members/non-members are known, and a
  quality warning when the accuracy is near chance or far below the model's own record (then no verdict is given);
- ``assess.toml``: the resolved configuration (absolute paths), which every finding's reproduce command runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from modelward.assess.config import AssessConfig
from modelward.assess.findings import scan_findings
from modelward.core.config import to_toml
from modelward.core.ledger import RunLedger
from modelward.core.records import atomic_write_json, atomic_write_text
from modelward.scan.scanner import scan_file


def scan_checkpoint(cfg: AssessConfig, out: Path) -> dict[str, Any] | None:
    """Scan the checkpoint file (never loading it) and write ``supply_chain.json``; None without a checkpoint."""
    if not cfg.checkpoint:
        return None

    scan = scan_file(cfg.checkpoint)
    record = {"scans": [scan.to_dict()],
              "findings": scan_findings(scan, f"modelward scan {cfg.checkpoint}")}
    atomic_write_json(out / "supply_chain.json", record)
    return record


def preflight(cfg: AssessConfig, out: Path) -> None:
    """Run the checks that come before any section (see the module docstring).

    Args:
        cfg: the resolved assessment config.
        out: the assessment folder.

    Raises:
        DataError: a model file the scan refuses, a missing file (the path tried is named).
    """
    atomic_write_text(out / "assess.toml", to_toml(cfg.model_dump(mode="json")))
    scan_checkpoint(cfg, out)
    # checked on every run, not cached: an entry point's code may have been fixed since the last one
    from modelward.assess.target import load_target, quality_warning

    target = load_target(cfg)  # fails fast on a bad checkpoint / data before any section runs
    acc, warning = quality_warning(target, cfg.expected_accuracy)
    atomic_write_json(out / "target.json", {"description": target.description, "kind": target.kind, "clean_accuracy": acc,
                                    "warning": warning, "membership": target.membership})


def reopen_sections(ledger: RunLedger, out: Path, sections: list[str], *, retry: bool) -> list[str]:
    """With `retry`, mark sections recorded as *not assessed* pending again (failed ones always are: the ledger
    keeps them failed); returns the sections reopened."""
    reopened = []
    for name in sections:
        f = out / name / "section.json"
        if retry and f.is_file() and json.loads(f.read_text()).get("status") in ("not_assessed", "failed"):
            if ledger.reopen(f"section|{name}"):
                reopened.append(name)
    return reopened
