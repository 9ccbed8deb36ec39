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
from modelward.scan.hf_folder import is_hf_folder, scan_hf_folder
from modelward.scan.scanner import scan_file


def scan_checkpoint(cfg: AssessConfig, out: Path) -> dict[str, Any] | None:
    """Scan the checkpoint file — or a Hugging Face model folder: its config, weights and code files
    (:mod:`modelward.scan.hf_folder`) — never loading it, and write ``supply_chain.json``; None without either."""
    folder = cfg.model.path if cfg.model is not None and cfg.model.resolved_source == "hf" else None
    if not cfg.checkpoint and not (folder and is_hf_folder(folder)):
        return None
    scans = [scan_file(cfg.checkpoint)] if cfg.checkpoint else scan_hf_folder(str(folder))
    findings = [f for s in scans for f in scan_findings(s, f"modelward scan {cfg.checkpoint or folder}")]
    record = {"scans": [s.to_dict() for s in scans], "findings": findings}
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
