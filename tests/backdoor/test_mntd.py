"""MNTD (meta neural trojan detection) with jumbo shadows: the jumbo distribution, shadow training through the ledger
(resumed, not retrained), a meta-classifier separating an obvious backdoor from clean models on the 8×8 digits, the
save/load round trip (safetensors + JSON, nothing unpickled) and config errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from modelward.assess.config import AssessConfig
from modelward.assess.sections import backdoor as section
from modelward.backdoor.detect.model.mntd import MNTD, draw_jumbo, jumbo_attack
from modelward.backdoor.detect.model.shadows import ShadowSet, train_shadows
from modelward.backdoor.experiment import (
    AttackSpec,
    BackdoorConfig,
    _model_meta,
    mntd_detector,
    run_detect,
    train_backdoored,
)
from modelward.core.data import DataConfig, DataSplit, load_data
from modelward.core.io import save_state_dict, save_tensors
from modelward.core.progress import RecordingProgress
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig
from modelward.errors import ConfigError, DataError

TINY = ModelConfig(arch="cnn", channels=[4, 8], fc=16)
FAST = TrainConfig(steps=100, eval_every=100)
CLIP = (0.0, 1.0)


@pytest.fixture(scope="module")
def shadows(tmp_path_factory: pytest.TempPathFactory, digits: DataSplit) -> tuple[Path, ShadowSet]:
    """2 clean, 3 dirty-label jumbo and 2 calibration shadows of a tiny CNN (100 steps each), and the surrogate."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("mntd") / "shadows"
    return out, train_shadows(out, digits, TINY, FAST, CLIP, clean=2, jumbo=3, calibration=2, seed=500,
                              clean_label_share=0.0)


def test_jumbo_draws_are_seeded_and_in_range(digits: DataSplit) -> None:
    shares = [0.1] * 10
    a = [draw_jumbo(np.random.default_rng(s), (1, 8, 8), shares, 0.5) for s in range(40)]
    assert a == [draw_jumbo(np.random.default_rng(s), (1, 8, 8), shares, 0.5) for s in range(40)]
    assert {d.kind for d in a} == {"patch", "blend"} and {d.clean_label for d in a} == {True, False}
    for d in a:
        assert 0 <= d.target < 10
        for r0, c0, h, w in d.rects:
            assert 0 <= r0 and r0 + h <= 8 and 0 <= c0 and c0 + w <= 8
        assert (0.03 <= d.rate <= 0.09) if d.clean_label else (0.02 <= d.rate <= 0.15)
    # a clean-label draw poisons only rows of its target and keeps every label
    d = next(d for d in a if d.clean_label)
    ps = jumbo_attack(d, (1, 8, 8), CLIP, 0, None).poison(digits.x_train, digits.y_train)
    assert bool((ps.y == digits.y_train).all()) and bool((digits.y_train[ps.poisoned] == d.target).all())
    assert ps.n_poisoned > 0


def _tiny(digits: DataSplit, seed: int, backdoored: bool) -> torch.nn.Module:
    spec = AttackSpec(name="badnets", target=0, rate=0.1, params={"size": 3}) if backdoored else None
    cfg = BackdoorConfig(data=DataConfig(source="digits"), model=TINY, train=FAST, attack=spec, seed=seed)
    return train_backdoored(cfg, digits).model


@pytest.mark.slow  # 18 tiny models (~6 s)
def test_meta_classifier_separates_an_obvious_backdoor(digits: DataSplit) -> None:
    """Shadows: 5 clean and 5 BadNets (3×3 corner patch → class 0) tiny CNNs; held out: 4 of each, other seeds. With
    this few shadows single held-out models still vary (measured over meta seeds 0–4: ≥ 3 of 4 backdoored above every
    calibration score, mean gap 2.5–6.4 logits), so the test asserts those, with margin; the jumbo generalisation is
    the bench's (bench/backdoor_mntd.py)."""
    torch.set_num_threads(1)
    shadows = [_tiny(digits, s, False) for s in range(5)] + [_tiny(digits, s, True) for s in range(5, 10)]
    calibration = [_tiny(digits, s, False) for s in range(10, 13)]
    held_bd = [_tiny(digits, s, True) for s in range(20, 24)]
    held_clean = [_tiny(digits, s, False) for s in range(30, 34)]
    det = MNTD(queries=6, epochs=30, alpha=0.3, seed=1).fit(shadows, [0] * 5 + [1] * 5, calibration, (1, 8, 8), 10,
                                                            CLIP)
    assert det.info["train_accuracy"] == 1.0
    bd = np.array([det.score(m) for m in held_bd])
    cl = np.array([det.score(m) for m in held_clean])
    assert (bd > det.calibration_scores.max()).sum() >= 3
    assert bd.mean() > cl.mean() + 1.5
    flagged = [det.detect(m) for m in held_bd]
    assert sum(v.backdoored for v in flagged) >= 3 and all(v.p_value in (0.25, 0.5, 0.75, 1.0) for v in flagged)


def test_shadow_training_resumes_from_the_ledger(shadows: tuple[Path, ShadowSet], digits: DataSplit) -> None:
    out, ss = shadows
    rec = RecordingProgress()
    again = train_shadows(out, digits, TINY, FAST, CLIP, clean=2, jumbo=3, calibration=2, seed=500,
                          clean_label_share=0.0, progress=rec)
    assert again.records == ss.records  # nothing retrained: the ledger's results, weights read back
    assert rec.completed("mntd-shadows") == 8
    x = digits.x_test[:16]
    for a, b in zip(again.models, ss.models, strict=True):
        assert torch.equal(a(x), b(x))  # same process and kernels: bit-exact
    with pytest.raises(Exception, match="config|fingerprint|another"):  # another recipe in the same folder
        train_shadows(out, digits, TINY, FAST.model_copy(update={"steps": 60}), CLIP, clean=2, jumbo=3,
                      calibration=2, seed=500, clean_label_share=0.0)


def test_save_load_round_trip_and_refusals(shadows: tuple[Path, ShadowSet], tmp_path: Path) -> None:
    _, ss = shadows
    det = MNTD(queries=4, epochs=5, seed=1).fit(ss.models, ss.labels, ss.calibration, (1, 8, 8), 10, CLIP)
    det.save(tmp_path / "m.safetensors")
    back = MNTD.load(tmp_path / "m.safetensors")
    assert [back.score(m) for m in ss.models] == [det.score(m) for m in ss.models]
    assert np.array_equal(back.calibration_scores, det.calibration_scores)
    assert back.input_shape == (1, 8, 8) and back.num_classes == 10
    save_tensors(tmp_path / "other.safetensors", {"w": torch.zeros(2)})
    with pytest.raises(DataError, match="not an MNTD meta-classifier"):
        MNTD.load(tmp_path / "other.safetensors")
    with pytest.raises(ConfigError, match="labels 0"):
        MNTD().fit(ss.models[:2], [0, 0], ss.calibration, (1, 8, 8), 10, CLIP)


def test_config_errors(tmp_path: Path, shadows: tuple[Path, ShadowSet], digits: DataSplit) -> None:
    with pytest.raises(ValidationError, match="detect.mntd.alpha|alpha"):
        BackdoorConfig.model_validate({"detect": {"mntd": {"enabled": True, "alpha": 1.5}}})
    with pytest.raises(ValidationError, match="querys"):
        BackdoorConfig.model_validate({"detect": {"mntd": {"querys": 10}}})
    # a meta-classifier made for other inputs is refused, naming the field and what to do
    _, ss = shadows
    det = MNTD(queries=4, epochs=2).fit(ss.models, ss.labels, ss.calibration, (1, 8, 8), 10, CLIP)
    det.save(tmp_path / "m.safetensors")
    cfg = BackdoorConfig.model_validate({"data": {"source": "synthetic_images", "channels": 3, "image_size": 16,
                                                  "n_samples": 200},
                                         "detect": {"mntd": {"enabled": True,
                                                             "meta": str(tmp_path / "m.safetensors")}}})
    with pytest.raises(ConfigError, match="detect.mntd.meta"):
        mntd_detector(cfg, load_data(cfg.data))


def test_assess_section_refuses_a_bad_meta_classifier(tmp_path: Path, shadows: tuple[Path, ShadowSet],
                                                      digits: DataSplit) -> None:
    """[backdoor] mntd: unreadable or made for other inputs → ConfigError naming the field, before any work."""
    save_tensors(tmp_path / "other.safetensors", {"w": torch.zeros(2)})
    cfg = AssessConfig(checkpoint="unused.safetensors", sections=["backdoor"],
                       backdoor={"mntd": str(tmp_path / "other.safetensors")})
    with pytest.raises(ConfigError, match="backdoor.mntd: .*not an MNTD"):
        section._mntd(cfg, digits)
    _, ss = shadows
    MNTD(queries=4, epochs=2).fit(ss.models, ss.labels, ss.calibration, (1, 8, 8), 10, CLIP).save(tmp_path / "m.st")
    rgb = load_data(DataConfig(source="synthetic_images", channels=3, image_size=16, n_samples=200))
    cfg = AssessConfig(checkpoint="unused.safetensors", sections=["backdoor"], backdoor={"mntd": str(tmp_path / "m.st")})
    with pytest.raises(ConfigError, match="backdoor.mntd: .*trained for inputs"):
        section._mntd(cfg, rgb)
    assert section._mntd(cfg, digits) is not None
    # unset, it stays out of the config's dump (recorded assessments keep their fingerprint)
    refs = {"reference": ["a", "b", "c"]}
    assert "mntd" not in AssessConfig(checkpoint="x", backdoor=refs).model_dump()["backdoor"]


def test_run_detect_with_mntd_alone(tmp_path: Path, shadows: tuple[Path, ShadowSet], digits: DataSplit) -> None:
    """`backdoor detect` with [detect.mntd] and the other detectors off: the saved meta-classifier is read (not
    retrained), its verdict is in detect.json and decides ``backdoored``."""
    _, ss = shadows
    det = MNTD(queries=4, epochs=5, alpha=0.4).fit(ss.models, ss.labels, ss.calibration, (1, 8, 8), 10, CLIP)
    det.save(tmp_path / "m.safetensors")
    cfg = BackdoorConfig.model_validate({"model": TINY.model_dump(), "train": FAST.model_dump(), "detect": {
        "neural_cleanse": {"enabled": False}, "mmbd": {"enabled": False}, "bn_shift": {"enabled": False},
        "mntd": {"enabled": True, "meta": str(tmp_path / "m.safetensors"), "alpha": 0.4,
                 "shadows": str(tmp_path / "must_not_exist")}}})
    suspect = ss.models[-1]
    save_state_dict(tmp_path / "model.safetensors", suspect.state_dict(), _model_meta(cfg, digits, {}))
    res = run_detect(cfg, tmp_path / "model.safetensors", tmp_path / "out")
    assert not (tmp_path / "must_not_exist").exists()
    (v,) = res["verdicts"]
    want = det.detect(suspect)
    assert v["detector"] == "mntd" and v["p_value"] == want.p_value and res["backdoored"] == want.backdoored
    assert res["decided_by"].endswith("or MNTD")


def test_run_detect_runs_an_enabled_bn_shift_beside_mntd(tmp_path: Path, shadows: tuple[Path, ShadowSet],
                                                         digits: DataSplit) -> None:
    """With Neural Cleanse and MM-BD off but the BN shift on (its default), both it and MNTD give a verdict; the
    union decides."""
    _, ss = shadows
    det = MNTD(queries=4, epochs=5, alpha=0.4).fit(ss.models, ss.labels, ss.calibration, (1, 8, 8), 10, CLIP)
    det.save(tmp_path / "m.safetensors")
    cfg = BackdoorConfig.model_validate({"model": TINY.model_dump(), "train": FAST.model_dump(), "detect": {
        "neural_cleanse": {"enabled": False}, "mmbd": {"enabled": False},
        "mntd": {"enabled": True, "meta": str(tmp_path / "m.safetensors"), "alpha": 0.4}}})
    suspect = ss.models[-1]
    save_state_dict(tmp_path / "model.safetensors", suspect.state_dict(), _model_meta(cfg, digits, {}))
    res = run_detect(cfg, tmp_path / "model.safetensors", tmp_path / "out")
    assert [v["detector"] for v in res["verdicts"]] == ["bn_shift", "mntd"]
    assert res["backdoored"] == any(v["backdoored"] for v in res["verdicts"])
