"""Data-level detection: on features whose poisoned rows are known by construction, and on the poisoned training
set of a backdoored model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from modelward.backdoor.detect.data.activation_clustering import ActivationClustering
from modelward.backdoor.detect.data.base import roc_auc
from modelward.backdoor.detect.data.spectral import SpectralSignature
from modelward.backdoor.detect.data.spectre import Spectre
from modelward.backdoor.experiment import ScanOptions, Trained, scan_data

DETECTORS = [ActivationClustering(), SpectralSignature(epsilon=0.2), Spectre(epsilon=0.2)]


def planted_features(share: float, seed: int = 0) -> tuple[np.ndarray, torch.Tensor, np.ndarray]:
    """Five classes of Gaussian features; in class 2, ``share`` of the rows sit 6 σ away along one direction."""
    rng = np.random.default_rng(seed)
    n, d = 200, 16
    y = np.repeat(np.arange(5), n)
    f = rng.standard_normal((5 * n, d)) + 3 * np.eye(5, d)[y]
    rows = np.flatnonzero(y == 2)
    poisoned = np.zeros(len(y), bool)
    poisoned[rows[: int(share * n)]] = True
    f[poisoned] += 6 * np.eye(d)[7]
    return f, torch.as_tensor(y), poisoned


@pytest.mark.parametrize("det", DETECTORS, ids=lambda d: d.name)
def test_each_method_ranks_planted_rows_first(det: object) -> None:
    f, y, poisoned = planted_features(0.2)
    scan = det.scan(None, torch.zeros(len(y)), y, features=f)  # type: ignore[attr-defined]
    in_class = y.numpy() == 2
    assert roc_auc(scan.scores[in_class], poisoned[in_class]) > 0.97
    # across classes: spectral signatures' per-class normalisation leaves the clean classes' χ² tails near the
    # poisoned rows (0.93 here); activation clustering and SPECTRE separate them
    assert roc_auc(scan.scores, poisoned) > (0.9 if det.name == "spectral_signature" else 0.97)  # type: ignore[attr-defined]
    assert (scan.suspected & poisoned).sum() >= 0.9 * poisoned.sum()
    assert set(scan.top(int(poisoned.sum()))) & set(np.flatnonzero(poisoned))


def test_activation_clustering_rules_and_spectre_under_heavy_poisoning() -> None:
    f, y, poisoned = planted_features(0.2)
    ac = ActivationClustering().scan(None, torch.zeros(len(y)), y, features=f)
    flagged = [c["class"] for c in ac.per_class if c.get("poisoned")]
    assert flagged == [2]  # the size rule calls only the planted class poisoned
    assert not ac.suspected[y.numpy() != 2].any()
    # 30 % of the class poisoned: the ordinary mean moves towards the poisoned rows and the clean rows score high
    # too (spectral signatures: 0.84 across classes); SPECTRE's robust estimate whitens with the clean rows'
    # statistics (near 1; at 45 % its MCD estimate mixes the two groups as well, docs/backdoor.md)
    f, y, poisoned = planted_features(0.3)
    ss = roc_auc(SpectralSignature(epsilon=0.3).scan(None, torch.zeros(len(y)), y, features=f).scores, poisoned)
    sp = roc_auc(Spectre(epsilon=0.3).scan(None, torch.zeros(len(y)), y, features=f).scores, poisoned)
    assert sp > 0.97 and sp > ss + 0.05


def test_roc_auc_counts_ties_half_and_needs_both_classes() -> None:
    assert roc_auc(np.array([1.0, 1.0]), np.array([True, False])) == 0.5
    assert roc_auc(np.array([0.1, 0.9, 0.5]), np.array([False, True, False])) == 1.0
    assert np.isnan(roc_auc(np.array([0.1, 0.2]), np.array([False, False])))


def test_scan_of_a_backdoored_models_training_set(backdoored: Trained) -> None:
    ps = backdoored.poisoned
    assert ps is not None
    scans = {s.method: s for s in scan_data(backdoored.model, ps.x, ps.y, ScanOptions(epsilon=0.5), 0)}
    truth = ps.poisoned.numpy()
    assert set(scans) == {"activation_clustering", "spectral_signature", "spectre"}
    assert roc_auc(scans["spectre"].scores, truth) > 0.9
    in_target = (ps.y == ps.target).numpy()
    assert roc_auc(scans["activation_clustering"].scores[in_target], truth[in_target]) > 0.9
    assert all(len(s.scores) == len(ps.y) for s in scans.values())


def test_spectre_auto_k_is_the_authors_search() -> None:
    """``dims="auto"`` tries k ∈ round((1..8)²) within the class's cap and keeps one; on the planted
    features (the poison along one direction) it still ranks the planted rows first within the class."""
    f, y, poisoned = planted_features(0.2)
    scan = Spectre(dims="auto", epsilon=0.2).scan(None, torch.zeros(len(y)), y, features=f)
    # the candidates round((1, ..., 8)²) = 1, 4, 9, ..., 64 that fit the 16 feature dimensions
    assert all(c["dims"] in {1, 4, 9, 16} for c in scan.per_class)
    in_class = y.numpy() == 2
    assert roc_auc(scan.scores[in_class], poisoned[in_class]) > 0.97
    fixed = Spectre(dims=3, epsilon=0.2).scan(None, torch.zeros(len(y)), y, features=f)
    assert all(c["dims"] == 3 for c in fixed.per_class)
