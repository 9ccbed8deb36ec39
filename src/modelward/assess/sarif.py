"""Findings as SARIF 2.1.0 (OASIS), the format code-scanning dashboards ingest (``modelward assess --format sarif``,
``modelward scan --format sarif``).

One ``run`` with modelward as the tool; one ``reportingDescriptor`` (rule) per finding id, carrying the OWASP ML Top
10, MITRE ATLAS and NIST AI RMF ids as tags and properties; one ``result`` per finding with its level
(critical/high → ``error``, medium → ``warning``, low → ``note``, info → ``none``), a ``security-severity`` score
(GitHub's convention: 9.5 / 8.0 / 5.0 / 2.0 / 0.0), the measured value and its interval in ``properties``, and a
location: the model file (the checkpoint, or the scanned file), else the assessment's ``report.html``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

from modelward.assess.findings import fmt_value

SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
_LEVEL = {"critical": "error", "high": "error", "medium": "warning", "low": "note", "info": "none"}
_SCORE = {"critical": "9.5", "high": "8.0", "medium": "5.0", "low": "2.0", "info": "0.0"}


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("modelward")
    except metadata.PackageNotFoundError:  # pragma: no cover - a source checkout without metadata
        return "0"


BASE_ID = "%SRCROOT%"


def _location(path: str, base: Path) -> dict[str, str]:
    """A SARIF artifactLocation: relative to the base (with its uriBaseId) when the file is under it."""
    p = Path(path)
    full = (p if p.is_absolute() else base / p).resolve()
    try:
        rel = full.relative_to(base)
    except ValueError:
        return {"uri": full.as_uri()}
    return {"uri": quote(rel.as_posix()), "uriBaseId": BASE_ID}


def to_sarif(findings: list[dict[str, Any]], *, default_location: str | None = None,
             base: str | Path | None = None) -> dict[str, Any]:
    """A SARIF 2.1.0 log of `findings` (dicts as :class:`modelward.assess.findings.Finding.to_dict` gives).

    Args:
        findings: the findings.
        default_location: the file a finding without its own location points at (the report).
        base: the folder locations are written relative to (default: the working directory).

    Returns:
        The SARIF log as a JSON-able dict (validated against the OASIS schema in the tests).

    Example:
        >>> to_sarif([])["version"]
        '2.1.0'
    """
    root = Path(base if base is not None else Path.cwd()).resolve()
    rules: dict[str, dict[str, Any]] = {}
    results = []
    for f in findings:
        if f["id"] not in rules:
            rules[f["id"]] = {
                "id": f["id"], "name": f["section"].title().replace("_", "") + "Finding",
                "shortDescription": {"text": f["title"][:200]},
                "fullDescription": {"text": f"{f['title']}. Verdict rule: {f['rule']}"},
                "help": {"text": "Recommended actions: " + (" ".join(f["actions"]) or "none") +
                         f" Reproduce: {f['reproduce']}"},
                "properties": {"tags": ["security", *f["owasp"], *f["atlas"], *f["nist"]],
                               "owasp-ml-top-10": f["owasp"], "mitre-atlas": f["atlas"], "nist-ai-rmf": f["nist"],
                               "security-severity": _SCORE[f["severity"]]},
            }
        ci = f.get("ci")
        value = fmt_value(f["value"], f["unit"])
        text = f"{f['title']}: {value}" + (f" (95 % CI {fmt_value(ci[0], f['unit'])} – {fmt_value(ci[1], f['unit'])})"
                                          if ci else "") + f" — severity {f['severity']}."
        where = f.get("locations") or ([default_location] if default_location else [])
        result: dict[str, Any] = {
            "ruleId": f["id"], "ruleIndex": list(rules).index(f["id"]), "level": _LEVEL[f["severity"]],
            "message": {"text": text},
            "properties": {"severity": f["severity"], "value": f["value"], "ci": ci, "n": f.get("n"),
                           "unit": f["unit"], "reproduce": f["reproduce"], "actions": f["actions"],
                           "security-severity": _SCORE[f["severity"]]},
        }
        if where:
            result["locations"] = [{"physicalLocation": {"artifactLocation": _location(w, root)}} for w in where]
        results.append(result)
    return {
        "$schema": SARIF_SCHEMA, "version": "2.1.0",
        "runs": [{"tool": {"driver": {"name": "modelward", "version": _version(),
                                      "rules": list(rules.values())}},
                  "originalUriBaseIds": {BASE_ID: {"uri": root.as_uri() + "/",
                                                   "description": {"text": "the folder the paths are relative to "
                                                                           "(where modelward ran)"}}},
                  "results": results}],
    }
