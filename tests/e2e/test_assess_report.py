"""`modelward assess` on digits (quick profile), rendered in a real browser: headless Chromium driven by Playwright.

Skips, saying why, where Debian's chromium or the playwright package is missing (``make test`` installs both).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "modelward.cli.main", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=400, env=env)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("assess")
    (work / "train.toml").write_text('[model]\narch = "cnn"\nchannels = [8, 16]\nfc = 32\n'
                                     "[train]\nsteps = 150\neval_every = 50\n")
    r = _cli("train", "train.toml", "--out", "model.safetensors", cwd=work)
    assert r.returncode == 0, r.stderr
    (work / "assess.toml").write_text('name = "digits-cnn"\ncheckpoint = "model.safetensors"\nprofile = "quick"\n')
    r = _cli("assess", "assess.toml", "--out", "out", cwd=work)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "report:" in r.stdout
    return work / "out"


def test_report_json_has_every_section_with_a_reason_or_a_verdict(report: Path) -> None:
    data = json.loads((report / "report.json").read_text())
    names = [s["section"] for s in data["sections"]]
    assert names == ["robustness", "privacy", "extraction", "completion", "explanations", "backdoor"]
    for s in data["sections"]:
        assert s["status"] in ("assessed", "not_assessed", "failed")
        if s["status"] == "assessed":
            assert s["verdict"] in ("green", "amber", "red", "info") and s["headline"] and s["figures"]
        else:
            assert s["reason"]  # never silently dropped
    by = {s["section"]: s for s in data["sections"]}
    assert by["robustness"]["status"] == "assessed" and by["extraction"]["status"] == "assessed"
    assert by["completion"]["status"] == "not_assessed" and "split" in by["completion"]["reason"]
    assert set(data["timing"]) == set(names) and data["versions"]["torch"]
    # findings: the JSON twin carries them, each filed under OWASP ML Top 10 and MITRE ATLAS, with an interval
    findings = data["findings"]
    assert findings and all(f["owasp"] and f["atlas"] and f["nist"] and f["reproduce"] for f in findings)
    assert {f["section"] for f in findings} >= {"robustness", "privacy", "extraction", "explanations", "supply_chain"}
    assert by["privacy"]["status"] == "assessed"  # members: the split recorded in the checkpoint's metadata
    assert data["warnings"] == [] and data["clean_accuracy"] > 0.8  # the model matches its own record
    # issue 28: the AutoAttack sandwich at the reference radii joins the threat models the headline is the worst of
    sandwich = {t["name"]: t for t in by["robustness"]["tables"]}["sandwich"]["rows"]
    assert {r["norm"] for r in sandwich} == {"L∞", "ℓ2"}
    assert all(r["certified_lower"] <= r["autoattack_upper"] for r in sandwich)
    threats = [m for m in by["robustness"]["metrics"] if m["context"].get("threat")]
    assert any(m["context"]["attack"] == "autoattack" for m in threats)
    assert by["robustness"]["headline"]["value"] == min(m["value"] for m in threats)
    rob = [f for f in findings if f["section"] == "robustness" and f["headline"]][0]
    assert rob["ci"][0] <= rob["value"] <= rob["ci"][1] and rob["n"] in (200, 50)  # C&W: 50 points
    assert data["model_files"][0]["clean"] and data["model_files"][0]["format"] == "safetensors"
    # issue 30: the substitute stolen behind ModelGuard-S is verified against the answer watermark, and the
    # detector's verdict on the attacker's stream is reported
    own = {t["name"]: t for t in by["extraction"]["tables"]}["ownership"]["rows"][0]
    assert own["verification_queries"] == own["marked_rows"] and 0.0 <= own["watermark_p"] <= 1.0
    assert own["marked_rows"] <= 0.02 * own["queries"] + 5 and isinstance(own["detector_flagged"], bool)
    sarif = json.loads((report / "report.sarif").read_text())
    assert len(sarif["runs"][0]["results"]) == len(findings)
    html = (report / "report.html").read_text()
    assert "<script" not in html.lower() and "http://" not in html and "https://" not in html
    # resuming a finished assessment recomputes nothing and gives the same sections
    again = _cli("assess", str(report.parent / "assess.toml"), "--out", str(report), cwd=report.parent)
    assert again.returncode == 0
    assert [s["seconds"] for s in json.loads((report / "report.json").read_text())["sections"]] == \
        [s["seconds"] for s in data["sections"]]


def test_report_renders_in_headless_chromium(report: Path) -> None:
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (make test installs it with apt-get where it can)")
    playwright = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    errors: list[str] = []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        requests: list[str] = []
        page.on("request", lambda r: requests.append(r.url))
        page.goto((report / "report.html").as_uri())
        for section in ("robustness", "privacy", "extraction", "completion", "explanations", "backdoor", "provenance"):
            assert page.locator(f"section#{section}").count() == 1, section
        assert page.locator(".card").count() == 6  # one per section (backdoor since issue 41)
        # the findings table comes first, one row per finding, each with its OWASP and ATLAS ids, visible
        table = page.locator("table#findings-table")
        assert table.count() == 1 and table.is_visible()
        n_findings = len(json.loads((report / "report.json").read_text())["findings"])
        rows = table.locator("tbody tr.finding")
        assert rows.count() == n_findings
        for i in range(rows.count()):
            text = rows.nth(i).inner_text()
            assert re.search(r"\bML(0[1-9]|10)\b", text) and "AML.T" in text, text  # OWASP ML01..ML10, ATLAS
        top = page.evaluate("document.querySelector('#findings-table').getBoundingClientRect().top")
        first_section = page.evaluate("document.querySelector('section#robustness').getBoundingClientRect().top")
        assert top < first_section
        broken = page.evaluate("Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0)"
                               ".map(i => i.alt)")
        assert page.locator("img").count() >= 3 and broken == []
        artifacts = REPO / "test-artifacts"
        artifacts.mkdir(exist_ok=True)
        page.screenshot(path=str(artifacts / "assess_report.png"), full_page=True)
        browser.close()
    assert errors == []
    assert all(u.startswith(("file:", "data:")) for u in requests), requests  # nothing from the network
    assert (artifacts / "assess_report.png").stat().st_size > 10_000
