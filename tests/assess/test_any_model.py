"""`modelward assess` on a user's own model and data, as a new user brings them: an RGB CNN (an entry point next to
the config, npz train/test files, a `.pt` state dict) and a CSV MLP (examples/assess_own_model.toml). Every section
runs on both (with small sizes: the real attacks, fewer points), the radii are the field's per modality, members are
the user's training rows, and every finding carries OWASP and ATLAS ids."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from modelward.assess.config import AssessConfig
from modelward.assess.profiles import PROFILES, ProfileSizes
from modelward.core.config import allow_code, load_config

REPO = Path(__file__).resolve().parents[2]
TINY = ProfileSizes(n_eval=48, linf_eps=(2 / 255, 8 / 255), l2_eps=(0.25, 0.5), reference_l2=0.5, pgd_steps=4,
                    cw_points=12, cw_steps=10, shadows=2, shadow_steps=40, mia_points=40, query_budget=80,
                    substitute_epochs=2, completion_seeds=1, completion_steps=20, inversion_steps=4,
                    explain_points=30)

pytest.importorskip("picklescan", reason="the picklescan package is not installed (modelward[scan])")


def _rgb_files(d: Path) -> None:
    """Two-class 3×8×8 images in [0, 1] (red-ish vs blue-ish blobs) and an RGB CNN trained on them in plain
    PyTorch, saved with torch.save(state_dict) as users do."""
    rng = np.random.default_rng(0)

    def make(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, 2, n)
        x = rng.random((n, 3, 8, 8)).astype(np.float32) * 0.5
        x[y == 0, 0] += 0.4
        x[y == 1, 2] += 0.4
        return np.clip(x, 0, 1), y

    (xtr, ytr), (xte, yte) = make(160), make(100)
    np.savez(d / "train.npz", x=xtr, y=ytr)
    np.savez(d / "test.npz", x=xte, y=yte)
    shutil.copy(REPO / "examples" / "own_model" / "nets.py", d / "mynets.py")
    sys.path.insert(0, str(d))
    try:
        import mynets
    finally:
        sys.path.remove(str(d))
        sys.modules.pop("mynets", None)
    torch.manual_seed(0)
    model = mynets.small_cnn((3, 8, 8), 2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    xt, yt = torch.as_tensor(xtr), torch.as_tensor(ytr)
    for _ in range(30):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xt), yt).backward()
        opt.step()
    torch.save(model.eval().state_dict(), d / "rgb_cnn.pt")
    (d / "assess.toml").write_text(
        'name = "rgb-cnn"\ncheckpoint = "rgb_cnn.pt"\n'
        '[model]\narch = "entrypoint"\nentrypoint = "mynets:small_cnn"\n'
        '[data]\nsource = "npz"\npath = "train.npz"\ntest_path = "test.npz"\n'
        "[train]\nsteps = 20\nbatch_size = 64\n")


def _assess(config: Path, out: Path, monkeypatch: pytest.MonkeyPatch, **kw: object) -> dict:
    from modelward.assess import run_assessment

    monkeypatch.setitem(PROFILES, "quick", TINY)
    # this user trusts the factory beside the config (as --trust-code or `modelward trust allow` would say)
    cfg = allow_code(load_config(config, AssessConfig).resolve_paths(config.parent))
    run_assessment(cfg, out, **kw)  # type: ignore[arg-type]
    return json.loads((out / "report.json").read_text())


def _check_every_section_and_finding(report: dict) -> None:
    by = {s["section"]: s for s in report["sections"]}
    for name in ("robustness", "privacy", "extraction", "explanations"):
        assert by[name]["status"] == "assessed", (name, by[name].get("reason"))
        assert by[name]["findings"], name
    assert by["completion"]["status"] == "not_assessed"
    assert report["findings"]
    for f in report["findings"]:  # 100 % of findings carry OWASP and ATLAS ids
        assert f["owasp"] and f["atlas"] and f["nist"], f["id"]
        assert all(i.startswith("ML") for i in f["owasp"]) and all(i.startswith("AML.T") for i in f["atlas"])
        assert f["reproduce"].startswith("modelward ")
        if f["severity"] != "info" and f["section"] != "supply_chain":
            assert f["actions"], f["id"]
    for f in report["findings"]:
        if f["n"] and f["ci"] and f["unit"] == "fraction":
            assert f["ci"][0] <= f["value"] <= f["ci"][1]


def test_rgb_cnn_from_a_pt_file_and_npz_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "project"
    work.mkdir()
    _rgb_files(work)
    report = _assess(work / "assess.toml", tmp_path / "out", monkeypatch)  # run from elsewhere: paths from config
    _check_every_section_and_finding(report)
    by = {s["section"]: s for s in report["sections"]}
    rob = {m["key"].split("@")[0]: m for m in by["robustness"]["metrics"]}
    assert rob["pgd_linf"]["context"]["epsilon"] == pytest.approx(8 / 255)  # RobustBench's radii for [0, 1] images
    assert rob["pgd_l2"]["context"]["epsilon"] == pytest.approx(0.5)
    assert {"fgsm_linf", "pgd_linf", "fgsm_l2", "pgd_l2", "cw_l2"} <= set(rob)
    worst = min(m["value"] for m in by["robustness"]["metrics"] if m["context"].get("threat"))
    assert by["robustness"]["headline"]["value"] == worst  # the card shows the worst attack and threat model
    assert (tmp_path / "out" / "explanations" / "attributions.png").stat().st_size > 1000  # C×H×W maps drawn
    assert "separate test file" in report["membership"]
    scan = report["model_files"][0]
    assert scan["clean"] and scan["format"] == "torch_zip"
    assert (tmp_path / "out" / "report.sarif").is_file()


@pytest.fixture(scope="module")
def own_example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/assess_own_model.toml and examples/own_model/ copied, with prepare.py run (in this process)."""
    import importlib.util

    ex = tmp_path_factory.mktemp("own") / "examples"
    shutil.copytree(REPO / "examples" / "own_model", ex / "own_model")
    shutil.copy(REPO / "examples" / "assess_own_model.toml", ex)
    spec = importlib.util.spec_from_file_location("own_model_prepare", ex / "own_model" / "prepare.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules.pop("nets", None)
    sys.path.remove(str(ex / "own_model"))
    module.main(ex / "own_model")
    return ex


def test_csv_mlp_example_own_model(own_example: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ex = own_example
    report = _assess(ex / "assess_own_model.toml", tmp_path / "out", monkeypatch)
    _check_every_section_and_finding(report)
    by = {s["section"]: s for s in report["sections"]}
    rob = {m["key"].split("@")[0]: m for m in by["robustness"]["metrics"]}
    # tabular: ε in units of each feature's standard deviation, never the raw input range
    assert rob["pgd_linf"]["context"]["epsilon"] == pytest.approx(0.1)
    assert "standard deviation" in rob["pgd_linf"]["context"]["scale"]
    assert report["warnings"] == [] and report["clean_accuracy"] > 0.9
    # members are exactly the rows of train.csv: the privacy section scored the user's own split
    assert "test file" in report["membership"]


def test_a_guessed_split_is_refused_and_a_mismatch_gives_no_verdict(own_example: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    ex = own_example
    # one file, no test_path, no train_index: assess would have to guess which rows were training rows
    toml = (ex / "assess_own_model.toml").read_text()  # the fixture's copy, which trusts its factory
    guessed = toml.replace('test_path = "own_model/test.csv"', "").replace("standardize = true", "standardize = false")
    cfg_text = guessed.replace('profile = "quick"', 'profile = "quick"\nsections = ["privacy", "explanations"]')
    (ex / "guess.toml").write_text(cfg_text)
    report = _assess(ex / "guess.toml", tmp_path / "out", monkeypatch)
    by = {s["section"]: s for s in report["sections"]}
    assert by["privacy"]["status"] == "not_assessed" and "train_index" in by["privacy"]["reason"]
    # raw (unstandardised) features: the model is near chance / below its record → warning, no verdict
    assert report["warnings"] and "no verdict" in report["warnings"][0]
    assert by["explanations"]["verdict"] == "info"
    assert all(f["severity"] == "info" for f in by["explanations"]["findings"])


def test_train_index_names_the_members(tmp_path: Path) -> None:
    from modelward.core.data import DataConfig, load_data

    rng = np.random.default_rng(0)
    x, y = rng.random((50, 4)).astype(np.float32), rng.integers(0, 2, 50)
    np.savez(tmp_path / "all.npz", x=x, y=y)
    mask = np.zeros(50, bool)
    mask[:35] = True
    np.save(tmp_path / "mask.npy", mask)
    d = load_data(DataConfig(source="npz", path=str(tmp_path / "all.npz"), train_index=str(tmp_path / "mask.npy"),
                             standardize=False))
    assert torch.equal(d.x_train, torch.as_tensor(x[:35])) and torch.equal(d.x_test, torch.as_tensor(x[35:]))
    with pytest.raises(ValueError, match="test_path is read for sources"):
        DataConfig(source="image_folder", path="imgs", test_path="other")
