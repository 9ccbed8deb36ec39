"""examples/assess_torchvision_resnet18.toml as shipped, end to end, with a torchvision ResNet-18 trained by its
prepare script and saved with torch.save(state_dict): one `modelward assess` command (quick profile, a few points
through --set) gives a report whose PGD robust accuracy agrees with torchattacks' PGD on the same points and whose
loss-attack scores equal an own per-row cross-entropy.

torchvision lives in its own venv (.venv-vision: `make vision`; PyPI's torchvision cannot load its C++ ops beside the
CPU torch, see README). In the main suite this file re-runs itself there when that venv exists, and skips with one
line when it does not; `make test-vision` runs it there directly.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
VISION_PY = ROOT / ".venv-vision" / "bin" / "python"
INNER = "MODELWARD_VISION_INNER"
# fewer points and steps, and only the reference radii (L∞ 8/255, ℓ2 0.5): a test, not an assessment
SMALL = ["sizes.n_eval=16", "sizes.cw_steps=10", "sizes.mia_points=40", "sizes.explain_points=10",
         "sizes.pgd_steps=5", f"robustness.linf_eps=[{8 / 255!r}]", "robustness.l2_eps=[0.5]"]


def _vision_here() -> bool:
    try:
        from modelward.core.sources import import_timm

        import_timm()
        import torchattacks  # noqa: F401 - the reference of the agreement check
    except Exception:  # noqa: BLE001 - any failure: not this venv
        return False
    return True


@pytest.mark.slow
def test_the_vision_example_in_its_venv():
    if _vision_here():
        _run_example_and_agree()
        return
    if os.environ.get(INNER) or not VISION_PY.is_file():
        pytest.skip("no .venv-vision with torchvision, timm and torchattacks here (`make vision` makes it; README: "
                    "models from torchvision, timm and Hugging Face)")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), INNER: "1", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([str(VISION_PY), "-m", "pytest", "-q", "-p", "no:cacheprovider", str(Path(__file__)),
                        "-k", "in_its_venv"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "1 passed" in r.stdout


def _run_example_and_agree() -> None:
    import tempfile

    import torchattacks

    tmp = Path(tempfile.mkdtemp(prefix="modelward-vision-"))
    shutil.copy(ROOT / "examples" / "assess_torchvision_resnet18.toml", tmp)
    (tmp / "torchvision_resnet18").mkdir()
    shutil.copy(ROOT / "examples" / "torchvision_resnet18" / "prepare.py", tmp / "torchvision_resnet18")
    spec = importlib.util.spec_from_file_location("vision_prepare", tmp / "torchvision_resnet18" / "prepare.py")
    prepare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prepare)
    # fewer images and steps than the example's, on a plainer version of its task (40 steps learn it; chance: 0.1)
    assert prepare.main(tmp / "torchvision_resnet18", n_train=320, n_test=160, steps=40, noise=0.1, contrast=0.6) > 0.3

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "modelward.cli.main", "assess", str(tmp / "assess_torchvision_resnet18.toml"),
           "--out", str(tmp / "out"), *(a for s in SMALL for a in ("--set", s))]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads((tmp / "out" / "report.json").read_text())
    sec = {s["section"]: s for s in report["sections"]}
    assert all(s["status"] == "assessed" for s in sec.values()), {k: s["reason"] for k, s in sec.items()}
    # the quick profile's budget: two shadow ResNet-18s, and AutoAttack on even its 10 points, are more than it
    # allows, and the report says so
    assert any("LiRA not run" in n for n in sec["privacy"]["notes"])
    assert any("AutoAttack not run" in n for n in sec["robustness"]["notes"])
    assert "sandwich" not in {t["name"] for t in sec["robustness"]["tables"]}
    assert report["model_files"][0]["format"] == "torch_zip" and report["model_files"][0]["clean"]

    from modelward.assess.config import AssessConfig
    from modelward.assess.target import load_target
    from modelward.core.config import load_config

    target = load_target(load_config(tmp / "out" / "assess.toml", AssessConfig))
    model = target.model.eval()
    x, y = target.data.x_test[:16], target.data.y_test[:16]
    atk = torchattacks.PGD(model, eps=8 / 255, alpha=2.5 * (8 / 255) / 5, steps=5, random_start=True)
    torch.manual_seed(0)
    theirs = float((model(atk(x, y)).argmax(1) == y).float().mean())
    ours = next(m["value"] for m in sec["robustness"]["metrics"] if m["key"].startswith("pgd_linf@"))
    # two implementations of the same attack from different random starts: within 2 of the 16 points
    assert abs(ours - theirs) <= 2 / 16 + 1e-9, (ours, theirs)

    pts = np.load(tmp / "out" / "privacy" / "points.npz")
    xs = torch.cat([target.data.x_train[pts["members"]], target.data.x_test[pts["non_members"]]])
    ys = torch.cat([target.data.y_train[pts["members"]], target.data.y_test[pts["non_members"]]])
    with torch.no_grad():
        own = -torch.nn.functional.cross_entropy(model(xs).double(), ys, reduction="none").numpy()
    np.testing.assert_allclose(np.load(tmp / "out" / "privacy" / "loss.scores.npy"), own, rtol=1e-4, atol=1e-5)
    shutil.rmtree(tmp, ignore_errors=True)
