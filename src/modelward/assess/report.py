"""report.json and a self-contained report.html, assembled from the files an assessment wrote.

The HTML page has no script, no external stylesheet, font or image: figures are inlined as ``data:`` PNGs and the
style sheet is in the page, so it opens offline, can be mailed as one file and prints cleanly (``@media print``).
Verdicts are written out in words next to their colour, so they survive black-and-white printing.
"""

from __future__ import annotations

import base64
import html
import json
import platform
import sys
import time
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import Any

from modelward.assess.bom import write_bom
from modelward.assess.findings import SEVERITY_ORDER, fmt_value
from modelward.assess.profiles import PROFILES
from modelward.assess.sarif import to_sarif
from modelward.assess.sections.common import load_sections
from modelward.core.records import atomic_write_json, atomic_write_text

VERDICT_WORDS = {"green": "low risk", "amber": "some risk", "red": "high risk", "info": "for information",
                 "none": "not assessed"}
_VERSIONED = ("modelward", "torch", "numpy", "scipy", "scikit-learn", "opacus", "ray", "captum")

CSS = """
:root { --green:#1b7f3b; --amber:#b26a00; --red:#b3261e; --none:#6b6b6b; --info:#2457a6; }
* { box-sizing: border-box; }
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; margin: 0;
       color: #1d1d1f; background: #fafafa; line-height: 1.45; }
main { max-width: 1100px; margin: 0 auto; padding: 24px; }
h1 { margin: 0 0 4px; font-size: 1.7rem; } h2 { margin-top: 0; } h3 { margin: 18px 0 6px; font-size: 1.02rem; }
.sub { color: #555; margin: 0 0 20px; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(200px, 1fr)); gap: 12px; margin-bottom: 28px; }
.card { background: #fff; border-radius: 10px; padding: 14px; border-top: 6px solid var(--none);
        box-shadow: 0 1px 3px rgba(0,0,0,.12); }
.card.green { border-top-color: var(--green); } .card.amber { border-top-color: var(--amber); }
.card.red { border-top-color: var(--red); } .card.info { border-top-color: var(--info); }
.card .t { font-weight: 600; font-size: .92rem; } .card .v { font-size: 1.6rem; font-weight: 700; margin: 6px 0 2px; }
.card .l { font-size: .8rem; color: #555; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 999px; color: #fff; font-size: .75rem;
         font-weight: 600; background: var(--none); }
.badge.green { background: var(--green); } .badge.amber { background: var(--amber); }
.badge.red { background: var(--red); } .badge.info { background: var(--info); }
section.s { background: #fff; border-radius: 10px; padding: 20px; margin-bottom: 22px;
            box-shadow: 0 1px 3px rgba(0,0,0,.12); page-break-inside: auto; }
table { border-collapse: collapse; margin: 6px 0 4px; font-size: .85rem; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: right; } th { background: #f0f0f0; }
td:first-child, th:first-child { text-align: left; }
figure { margin: 12px 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: .82rem; color: #555; } .note { font-size: .82rem; color: #555; }
.na { color: #6b6b6b; font-style: italic; } pre { background: #f4f4f4; padding: 10px; overflow-x: auto;
      font-size: .78rem; white-space: pre-wrap; }
.warn { background: #fff4e0; border-left: 6px solid var(--amber); padding: 10px 14px; margin: 0 0 18px;
        border-radius: 6px; }
table.findings { width: 100%; } table.findings td, table.findings th { text-align: left; vertical-align: top; }
table.findings td.num { text-align: right; white-space: nowrap; }
.sev { display: inline-block; padding: 1px 7px; border-radius: 999px; color: #fff; font-size: .72rem;
       font-weight: 600; background: var(--none); }
.sev.critical { background: #6d0f0a; } .sev.high { background: var(--red); } .sev.medium { background: var(--amber); }
.sev.low { background: var(--green); } .sev.info { background: var(--info); }
.ids { font-size: .74rem; color: #444; } ul.actions { margin: 0; padding-left: 16px; font-size: .8rem; }
pre.repro { font-size: .7rem; padding: 4px 6px; margin: 4px 0 0; }
@media print { body { background: #fff; } section.s, .card { box-shadow: none; border: 1px solid #ccc; }
               figure, table { page-break-inside: avoid; } }
"""


def _versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in _VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "–" if v != v else f"{v:.4g}"
    return html.escape(str(v))


def _table(t: dict[str, Any]) -> str:
    cols = t["columns"]
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(r.get(c, ''))}</td>" for c in cols) + "</tr>" for r in t["rows"])
    notes = "".join(f'<p class="note">{html.escape(n)}</p>' for n in t.get("notes", []))
    return f"<h3>{html.escape(t['title'])}</h3><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{notes}"


def _figure(out: Path, f: dict[str, str]) -> str:
    path = out / f["path"]
    if not path.is_file():
        return f'<p class="na">figure {html.escape(f["path"])} is missing</p>'
    b64 = base64.b64encode(path.read_bytes()).decode()
    return (f'<figure><img alt="{html.escape(f["title"])}" src="data:image/png;base64,{b64}">'
            f"<figcaption>{html.escape(f['title'])}{': ' + html.escape(f['caption']) if f.get('caption') else ''}"
            "</figcaption></figure>")


def _card(s: dict[str, Any]) -> str:
    v = s["verdict"]
    if s["status"] != "assessed" or not s.get("headline"):
        value, label = ("—", "not assessed" if s["status"] == "not_assessed" else "failed")
    else:
        value, label = s["headline"]["text"], s["headline"]["label"]
    return (f'<div class="card {v}"><div class="t">{html.escape(s["title"])}</div>'
            f'<div class="v">{html.escape(value)}</div><div class="l">{html.escape(label)}</div>'
            f'<div style="margin-top:6px"><span class="badge {v}">{VERDICT_WORDS[v]}</span></div></div>')


def _short_id(framework_id: str) -> str:
    """'ML04:2023 Membership Inference Attack' → 'ML04:2023'; 'MEASURE 2.10 (privacy ...)' → 'MEASURE 2.10'."""
    if framework_id.startswith(("MEASURE", "GOVERN", "MAP", "MANAGE")):
        return framework_id.split(" (")[0]
    return framework_id.split(" ")[0]


def _findings_table(findings: list[dict[str, Any]]) -> str:
    """The findings table at the top of the page: worst first, each with its interval, ids and actions."""
    if not findings:
        return '<p class="na">No findings (no section was assessed).</p>'
    rows = []
    for f in sorted(findings, key=lambda f: (SEVERITY_ORDER.index(f["severity"]), not f.get("headline"))):
        ci = f.get("ci")
        value = fmt_value(f["value"], f["unit"]) if f["unit"] != "count" else f"{int(f['value'] or 0)} issue(s)"
        interval = f"{fmt_value(ci[0], f['unit'])} – {fmt_value(ci[1], f['unit'])}" if ci else "–"
        ids = "<br>".join(f'<span title="{html.escape(i)}">{html.escape(_short_id(i))}</span>'
                          for i in [*f["owasp"], *f["atlas"], *f["nist"]])
        actions = "".join(f"<li>{html.escape(a)}</li>" for a in f["actions"])
        rows.append(
            f'<tr class="finding" data-severity="{f["severity"]}"><td><span class="sev {f["severity"]}">'
            f'{f["severity"]}</span></td><td><b>{html.escape(f["title"])}</b><div class="ids">{html.escape(f["id"])}'
            f'</div></td><td class="num">{value}</td><td class="num">{interval}</td><td class="ids">{ids}</td>'
            f'<td><ul class="actions">{actions}</ul><p class="note">Verdict rule: {html.escape(f["rule"])}</p>'
            f'<pre class="repro">{html.escape(f["reproduce"])}</pre></td></tr>')
    return ('<table class="findings" id="findings-table"><thead><tr><th>severity</th><th>finding</th><th>value</th>'
            "<th>95 % CI</th><th>OWASP ML / MITRE ATLAS / NIST AI RMF</th><th>what to do</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table><p class=\"note\">Ids: OWASP Machine Learning Security Top 10 "
            "(2023), MITRE ATLAS techniques, NIST AI RMF 1.0 subcategories (names in report.json and "
            "report.sarif). Intervals: Clopper–Pearson for rates counted from n points, Student-t over seeds.</p>")


def _model_files(scans: list[dict[str, Any]]) -> str:
    """What the model-file scan found (nothing was loaded to find it)."""
    if not scans:
        return ""
    rows = []
    for sc in scans:
        state = "clean" if sc["clean"] else f"{len(sc['issues'])} issue(s), worst {sc['severity']}"
        issues = "".join(f"<li>{html.escape(i['severity'])}: {html.escape(i['detail'])} "
                         f"({html.escape(i['where'])})</li>" for i in sc["issues"])
        rows.append(f"<tr><td>{html.escape(sc['path'])}</td><td>{html.escape(sc['format'])}</td>"
                    f"<td>{html.escape(sc['sha256'])}</td><td>{sc['size']:,}</td><td>{html.escape(state)}"
                    f"{'<ul>' + issues + '</ul>' if issues else ''}</td></tr>")
    return ('<section class="s" id="model-file"><h2>Model file (supply chain)</h2><p>The checkpoint was examined '
            "without loading it: pickle opcodes listed (picklescan, strict), nested archives opened, a safetensors "
            "header checked.</p><table><thead><tr><th>file</th><th>format</th><th>sha256</th><th>bytes</th>"
            f"<th>scan</th></tr></thead><tbody>{''.join(rows)}</tbody></table></section>")


def _section(out: Path, s: dict[str, Any]) -> str:
    v = s["verdict"]
    parts = [f'<section class="s" id="{s["section"]}"><h2>{html.escape(s["title"])} '
             f'<span class="badge {v}">{VERDICT_WORDS[v]}</span></h2>']
    parts += [f'<p class="warn">{html.escape(w)}</p>' for w in s.get("warnings", [])]
    if s["status"] == "not_assessed":
        parts.append(f'<p class="na">Not assessed, because {html.escape(s["reason"])}.</p>')
    elif s["status"] == "failed":
        parts.append(f'<p class="na">Failed: {html.escape(s["reason"])}</p>')
    else:
        parts.append(f"<p>{html.escape(s['summary'])}</p>")
        if s.get("rule"):
            parts.append(f'<p class="note">Verdict rule: {html.escape(s["rule"])}.</p>')
        parts += [_figure(out, f) for f in s["figures"]]
        parts += [_table(t) for t in s["tables"]]
        parts += [f'<p class="note">{html.escape(n)}</p>' for n in s.get("notes", [])]
    parts.append(f'<p class="note">time: {s["seconds"]:.1f} s</p></section>')
    return "".join(parts)


def build_report(out: Path) -> dict[str, Any]:
    """The report as data (what report.json holds)."""
    cfg = json.loads((out / "assess.json").read_text())
    target = json.loads((out / "target.json").read_text()) if (out / "target.json").is_file() else {}
    sections = load_sections(out)
    supply = json.loads((out / "supply_chain.json").read_text()) if (out / "supply_chain.json").is_file() else {}
    findings = [*supply.get("findings", []), *(f for s in sections for f in s.get("findings", []))]
    return {
        "findings": findings, "warnings": [target["warning"]] if target.get("warning") else [],
        "clean_accuracy": target.get("clean_accuracy"), "membership": target.get("membership"),
        "model_files": supply.get("scans", []),
        "name": cfg["name"], "model": target.get("description", cfg.get("checkpoint")),
        "generated": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "profile": cfg["profile"],
        "profile_sizes": replace(PROFILES[cfg["profile"]], **cfg.get("sizes", {})).__dict__,
        "size_overrides": cfg.get("sizes", {}), "seeds": {"seed": cfg["seed"]},
        "sections": sections, "timing": {s["section"]: round(s["seconds"], 2) for s in sections},
        "plans": {s["section"]: s.get("plan") or {} for s in sections},
        "config": cfg, "versions": _versions(),
    }


def _estimate(plan: dict[str, Any]) -> str:
    est = plan.get("estimate_seconds")
    return "–" if est is None else f"{est:.0f} s"


def render_html(out: Path, report: dict[str, Any]) -> str:
    cards = "".join(_card(s) for s in report["sections"])
    body = "".join(_section(out, s) for s in report["sections"])
    plans = report.get("plans", {})
    timing = "<tr><th>section</th><th>took</th><th>estimated</th><th>planned work</th></tr>" + "".join(
        f"<tr><td>{html.escape(k)}</td><td>{v:.1f} s</td>"
        f"<td>{_estimate(plans.get(k, {}))}</td><td>{html.escape(plans.get(k, {}).get('text', ''))}</td></tr>"
        for k, v in report["timing"].items())
    versions = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>"
                       for k, v in report["versions"].items())
    cfg = html.escape(json.dumps(report["config"], indent=2))
    warnings = "".join(f'<p class="warn" id="quality-warning"><b>Warning:</b> {html.escape(w)}</p>'
                       for w in report.get("warnings", []))
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>modelward security report: {html.escape(report['name'])}</title><style>{CSS}</style></head>"
            f"<body><main><h1>Security report: {html.escape(report['name'])}</h1>"
            f'<p class="sub">{html.escape(str(report["model"]))} · profile <b>{html.escape(report["profile"])}</b>'
            f" · seed {report['seeds']['seed']} · {html.escape(report['generated'])}</p>"
            f"{warnings}<h2>Findings</h2>{_findings_table(report.get('findings', []))}"
            f'<div class="cards" style="margin-top:18px">{cards}</div>{body}'
            f"{_model_files(report.get('model_files', []))}"
            f'<section class="s" id="provenance"><h2>Provenance</h2><h3>Time per section</h3><table>{timing}</table>'
            f"<h3>Versions</h3><table>{versions}</table><h3>Configuration</h3><pre>{cfg}</pre></section>"
            "</main></body></html>")


def write_report(out: str | Path) -> tuple[Path, Path]:
    """Write report.json and report.html into `out` from its section files; returns their paths.

    Args:
        out: an assessment folder (as written by :func:`~modelward.assess.run.run_assessment`).

    Returns:
        ``(report.json path, report.html path)``.

    Example:
        >>> json_path, html_path = write_report("assess-out")  # doctest: +SKIP
    """
    out = Path(out)
    report = build_report(out)
    j = atomic_write_json(out / "report.json", report)
    h = atomic_write_text(out / "report.html", render_html(out, report))
    atomic_write_json(out / "report.sarif", to_sarif(report["findings"], default_location=str(h)))
    try:
        write_bom(out, report)
    except ImportError:  # cyclonedx-python-lib is optional (modelward[bom])
        pass
    return j, h
