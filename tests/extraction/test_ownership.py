"""Answer watermark, boundary fingerprint, ownership verification and the PRADA detector (issue #30)."""

from __future__ import annotations

import math
import os
import stat

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from modelward.errors import ConfigError, DataError
from modelward.extraction.ownership import (
    AnswerWatermark,
    Fingerprint,
    LocalSuspect,
    PradaDetector,
    WatermarkRecords,
    load_or_create_key,
    make_fingerprint,
    random_seeds,
    verify_ownership,
    watermark_p_value,
)

K = 6
D = 12


def _mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D, 64), nn.ReLU(), nn.Linear(64, K))


def _task(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(K, D, generator=torch.Generator().manual_seed(123)) * 2.0
    y = torch.randint(0, K, (n,), generator=g)
    return centers[y] + torch.randn(n, D, generator=g), y


def _fit(model: nn.Module, x: torch.Tensor, target: torch.Tensor, epochs: int, seed: int) -> nn.Module:
    """Full-batch-ish Adam on hard labels (long) or soft labels (float rows)."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=g)
        for i in range(0, len(x), 128):
            idx = perm[i : i + 128]
            z = model(x[idx])
            t = target[idx]
            loss = F.cross_entropy(z, t) if t.dtype == torch.long else -(t * F.log_softmax(z, 1)).sum(1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def owner_and_data() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    x, y = _task(1500, seed=1)
    return _fit(_mlp(0), x, y, epochs=15, seed=0), x, y


# -- watermark ------------------------------------------------------------------------------------------------
def test_the_watermark_is_deterministic_keyed_and_changes_about_the_configured_fraction() -> None:
    x = torch.rand(40_000, 5)
    probs = torch.softmax(torch.randn(40_000, K), 1)
    wm = AnswerWatermark(b"a" * 32, fraction=0.005)
    a, b = wm.apply(x, probs), wm.apply(x.clone(), probs)
    assert torch.equal(a.probs, b.probs) and torch.equal(a.marked, b.marked)  # same query -> same answer
    n = int(a.marked.sum())
    assert 140 <= n <= 260  # Binomial(40000, 0.005): mean 200, sd 14
    other = AnswerWatermark(b"b" * 32, fraction=0.005).apply(x, probs)
    assert int((other.marked & a.marked).sum()) < 10  # another key marks other rows
    rows = a.marked.nonzero().flatten()
    assert torch.equal(a.probs[rows].argmax(1), a.labels[rows])  # the keyed class is the new top-1
    assert (a.labels[rows] != probs[rows].argmax(1)).all()
    assert torch.allclose(a.probs.sum(1), torch.ones(len(x)))  # still on the simplex
    assert torch.equal(a.probs[~a.marked], probs[~a.marked])  # nothing else changes
    # the keyed class is uniform over the K - 1 others
    counts = np.bincount(((a.labels[rows] - probs[rows].argmax(1)) % K).numpy(), minlength=K)
    assert counts[0] == 0 and counts[1:].min() > 15


def test_the_fraction_is_capped_and_the_key_checked() -> None:
    with pytest.raises(ConfigError, match="0.005"):
        AnswerWatermark(b"a" * 32, fraction=0.01)
    with pytest.raises(ConfigError, match="16 bytes"):
        AnswerWatermark(b"short")


def test_the_key_file_is_private_and_stable(tmp_path) -> None:
    p = tmp_path / "state" / "watermark.key"
    k1 = load_or_create_key(p)
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    assert load_or_create_key(p) == k1 and len(k1) == 32
    p.write_bytes(b"x" * 5)
    with pytest.raises(DataError, match="32 bytes"):
        load_or_create_key(p)


def test_the_p_value_is_valid_for_innocent_models() -> None:
    """Over many innocent suspects (random models that never saw the key), P(p < a) <= a for both statistics."""
    wm = AnswerWatermark(b"c" * 32)
    owner = _mlp(0).eval()
    x = torch.randn(30, D)
    with torch.no_grad():
        top = owner(x).argmax(1)
    recs = WatermarkRecords(x, wm.marks(x, top, K), top, K)
    for labels_only in (False, True):
        ps = [verify_ownership(LocalSuspect(_mlp(100 + s), labels_only=labels_only), watermark=recs,
                               level=0.05).p_value for s in range(200)]
        for a in (0.05, 0.2):
            assert np.mean(np.array(ps) < a) <= a + 0.05, (labels_only, a)


def test_a_copy_trained_on_watermarked_answers_is_identified_and_an_independent_model_is_not(
        owner_and_data: tuple[nn.Module, torch.Tensor, torch.Tensor]) -> None:
    owner, _, _ = owner_and_data
    xq, _ = _task(4000, seed=7)  # the attacker's queries
    wm = AnswerWatermark(b"d" * 32, fraction=0.005)
    with torch.no_grad():
        clean = torch.softmax(owner(xq), 1)
    out = wm.apply(xq, clean)
    assert 8 <= int(out.marked.sum()) <= 40
    copy = _fit(_mlp(5), xq, out.probs, epochs=40, seed=5)
    rows = out.marked
    recs = WatermarkRecords(xq[rows], out.labels[rows], clean[rows].argmax(1), K)
    rep = verify_ownership(LocalSuspect(copy), watermark=recs)
    assert rep.evidence[0].queries == int(rows.sum())
    assert rep.evidence[0].p_value < 1e-4, rep.to_dict()
    x_own, y_own = _task(1500, seed=1)
    innocent = _fit(_mlp(9), x_own, y_own, epochs=15, seed=9)
    assert verify_ownership(LocalSuspect(innocent), watermark=recs).p_value > 1e-3


def test_watermark_p_value_edges() -> None:
    assert watermark_p_value(0, 0, 10) == 1.0
    assert math.isclose(watermark_p_value(1, 1, 10), 1 / 9)
    with pytest.raises(DataError):
        watermark_p_value(1, 1, 1)


# -- fingerprint ----------------------------------------------------------------------------------------------
def test_the_fingerprint_identifies_a_fine_tuned_copy_of_the_weights_not_an_independent_model(
        tmp_path, owner_and_data: tuple[nn.Module, torch.Tensor, torch.Tensor]) -> None:
    owner, x, y = owner_and_data
    refs = [_fit(_mlp(200 + s), x, y, epochs=15, seed=200 + s) for s in range(6)]
    fp = make_fingerprint(owner, random_seeds(x * 2, 400, seed=5), refs[:2], refs[2:], n_points=60, clip=None)
    assert len(fp) == 60 and torch.equal(fp.labels, owner(fp.x).argmax(1))
    stolen = _mlp(0)
    stolen.load_state_dict(owner.state_dict())
    stolen = _fit(stolen, x[:200], y[:200], epochs=2, seed=3)  # fine-tuned a little
    assert verify_ownership(LocalSuspect(stolen), fingerprint=fp).p_value < 1e-6
    innocent = _fit(_mlp(77), x, y, epochs=15, seed=77)
    assert verify_ownership(LocalSuspect(innocent), fingerprint=fp).p_value > 1e-3
    fp.save(tmp_path / "fp.safetensors")
    back = Fingerprint.load(tmp_path / "fp.safetensors")
    assert torch.equal(back.x, fp.x) and back.null_alpha == fp.null_alpha
    (tmp_path / "bad.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    with pytest.raises(DataError, match="fingerprint"):
        Fingerprint.load(tmp_path / "bad.safetensors")


# -- detector -------------------------------------------------------------------------------------------------
def _labels(x: torch.Tensor) -> torch.Tensor:
    return (x[:, 0] > 0).long() + (x[:, 1] > 0).long()


def test_prada_flags_a_synthetic_stream_and_not_a_natural_one() -> None:
    g = torch.Generator().manual_seed(0)
    natural = torch.randn(1500, 16, generator=g)
    seeds = torch.randn(60, 16, generator=g)
    synth = [seeds]
    while sum(len(s) for s in synth) < 1500:  # JBDA-like: small steps from earlier queries
        base = synth[-1]
        synth.append(base + 0.05 * torch.sign(torch.randn(base.shape, generator=g)))
    synthetic = torch.cat(synth)[:1500]
    det = PradaDetector(delta=0.93)
    for i in range(0, 1500, 50):
        v_nat, _ = det.observe("benign", natural[i : i + 50], _labels(natural[i : i + 50]))
        v_syn, _ = det.observe("attacker", synthetic[i : i + 50], _labels(synthetic[i : i + 50]))
    assert not v_nat.flagged and v_nat.queries == 1500
    assert v_syn.flagged and v_syn.flagged_at is not None and v_syn.flagged_at <= 500
