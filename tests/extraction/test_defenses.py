"""Invariants of the prediction-perturbation defenses (ModelGuard paper Eq. 5–7) and their exact specifications."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError, DataError
from modelward.extraction.defenses import DEFENSES, make_defense
from modelward.extraction.defenses.base import is_in_simplex, l1_distortion, top1_kept
from modelward.extraction.defenses.mad import _angular_objective
from modelward.extraction.defenses.modelguard_w import objective, solve_lp

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def prob_batches(draw, min_k: int = 2, max_k: int = 12, max_b: int = 6, ties: bool = True):
    """Batches of probability vectors: softmaxes at random temperatures, optionally coarsened to create ties."""
    k = draw(st.integers(min_k, max_k))
    b = draw(st.integers(1, max_b))
    seed = draw(st.integers(0, 2**31 - 1))
    scale = draw(st.sampled_from([0.1, 1.0, 3.0, 10.0]))
    g = torch.Generator().manual_seed(seed)
    y = torch.softmax(torch.randn(b, k, generator=g, dtype=torch.float64) * scale, 1)
    if ties and draw(st.booleans()):
        y = torch.round(y * 10) / 10 + 1e-3  # coarse values: exact ties between classes, even at the top
        y = y / y.sum(1, keepdim=True)
    return y


def _inputs(b: int, k: int):
    torch.manual_seed(k)
    model = build_model(ModelConfig(arch="mlp", hidden=[8]), (1, 3, 3), k)
    return model, torch.rand(b, 1, 3, 3, generator=torch.Generator().manual_seed(b))


def _defense(name: str, k: int, eps: float):
    model, _ = _inputs(1, k)
    return {
        "modelguard_w": lambda: make_defense(name, epsilon=eps),
        "modelguard_s": lambda: make_defense(name, epsilon=eps),
        "mad": lambda: make_defense(name, epsilon=eps, surrogate=model),
        "adaptive_misinformation": lambda: make_defense(name, tau=0.5, misinformation=model),
        "reverse_sigmoid": lambda: make_defense(name, beta=eps / 2, gamma=0.2),
        "gaussian_noise": lambda: make_defense(name, sigma=0.1, seed=3),
    }.get(name, lambda: make_defense(name))()


@SETTINGS
@given(y=prob_batches(), eps=st.sampled_from([0.05, 0.5, 1.0, 2.0]), name=st.sampled_from(sorted(DEFENSES)))
def test_every_defense_respects_its_invariants(y, eps, name):
    d = _defense(name, y.shape[1], eps)
    _, x = _inputs(y.shape[0], y.shape[1])
    out = d.defend(y, x)
    assert out.shape == y.shape and out.dtype == y.dtype
    assert is_in_simplex(out, 1e-6).all()
    if d.preserves_top1:
        strict = (y.max(1).values - y.topk(2, 1).values[:, 1]) > 0  # argmax of a tie is ambiguous
        assert top1_kept(y, out)[strict].all()
    if d.epsilon is not None:
        assert (l1_distortion(y, out) <= d.epsilon + 1e-6).all()
    if not d.stateful and name != "gaussian_noise":
        assert torch.equal(d.defend(y, x), out)  # deterministic


@settings(max_examples=60, deadline=None)
@given(y=prob_batches(max_k=10, max_b=3), eps=st.sampled_from([0.0, 1e-4, 0.01, 0.3, 1.0, 1.7, 2.0]))
def test_modelguard_w_fast_solver_matches_the_lp(y, eps):
    fast = make_defense("modelguard_w", epsilon=eps).defend(y)
    lp = make_defense("modelguard_w", epsilon=eps, solver="lp").defend(y)
    assert torch.allclose(objective(y, fast), objective(y, lp), atol=1e-6, rtol=0)
    feasible = [solve_lp(row, eps) is not None for row in y.numpy()]
    margin = 1e-4 - 1e-7
    for i, ok in enumerate(feasible):
        if ok:  # top-1 kept with the strict margin, ℓ1 within budget
            others = torch.cat([fast[i, : y[i].argmax()], fast[i, y[i].argmax() + 1:]])
            assert fast[i, y[i].argmax()] - others.max() >= margin
            assert l1_distortion(y[i:i + 1], fast[i:i + 1]).item() <= eps + 1e-9
        else:  # convention: infeasible queries are answered unchanged
            assert torch.allclose(fast[i], y[i])


def test_modelguard_w_structure_and_monotonicity():
    y = torch.tensor([[0.619, 0.212, 0.085, 0.03, 0.02, 0.01, 0.01, 0.007, 0.004, 0.003]], dtype=torch.float64)
    # ε = 2 (App. A.2 KKT): the top class and the least likely classes share the mass equally, the rest get 0
    out = make_defense("modelguard_w", epsilon=2.0).defend(y)[0]
    support = out > 1e-9
    assert support[0] and not support[1:5].any() and support[5:].all()
    assert torch.allclose(out[5:], out[5:].mean().expand(5), atol=1e-9) and abs(out[0] - out[5] - 1e-4) < 1e-9
    values = [objective(y, make_defense("modelguard_w", epsilon=e).defend(y)).item() for e in np.linspace(0, 2, 9)]
    assert all(b <= a + 1e-12 for a, b in zip(values, values[1:], strict=False))
    assert values[-1] < values[0] - 1.0


def test_modelguard_w_batch_of_100_classes_matches_lp():
    y = torch.softmax(torch.randn(5, 100, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3, 1)
    fast = make_defense("modelguard_w", epsilon=1.0).defend(y)
    lp = make_defense("modelguard_w", epsilon=1.0, solver="lp").defend(y)
    assert torch.allclose(objective(y, fast), objective(y, lp), atol=1e-6, rtol=0)


def test_modelguard_w_stress_900_cases_match_the_lp():
    """900 hard rows in batches: exact ties (also at the top), near-uniform and near-one-hot rows, zeros, every ε
    regime; the certified search must reach the LP optimum (objective within 1e-6) and keep the constraints."""
    g = torch.Generator().manual_seed(11)
    n_rows = 0
    for k in (2, 3, 5, 10, 40):
        for eps in (0.0, 1e-4, 0.05, 0.5, 1.2, 2.0):
            n = 30
            scale = torch.tensor([0.01, 0.3, 1.0, 3.0, 10.0, 30.0], dtype=torch.float64)[torch.arange(n) % 6, None]
            y = torch.softmax(torch.randn(n, k, generator=g, dtype=torch.float64) * scale, 1)
            y[::4] = torch.round(y[::4] * 8) / 8  # exact ties and exact zeros
            y[::4] = (y[::4] + 1e-9) / (y[::4] + 1e-9).sum(1, keepdim=True)
            fast = make_defense("modelguard_w", epsilon=eps).defend(y)
            lp = make_defense("modelguard_w", epsilon=eps, solver="lp").defend(y)
            gap = (objective(y, fast) - objective(y, lp)).abs().max().item()
            assert gap <= 1e-6, (k, eps, gap)
            assert (l1_distortion(y, fast) <= eps + 1e-8).all() and is_in_simplex(fast, 1e-9).all()
            n_rows += n
    assert n_rows == 900


@SETTINGS
@given(y=prob_batches(max_b=1, ties=False), eps=st.sampled_from([0.2, 0.7, 1.5]), n=st.integers(20, 120))
def test_modelguard_s_algorithm_1(y, eps, n):
    k = y.shape[1]
    g = torch.Generator().manual_seed(n)
    stream = torch.softmax(torch.randn(n, k, generator=g, dtype=torch.float64) * 2, 1)
    stream = torch.cat([stream, stream[: n // 3]])  # repeats after intervening queries
    d = make_defense("modelguard_s", epsilon=eps)
    out = torch.cat([d.defend(stream[i:i + 7]) for i in range(0, len(stream), 7)])
    assert (l1_distortion(stream, out) <= eps + 1e-12).all() and top1_kept(stream, out).all()
    # every answer is an earlier clean prediction (up to the 1e-16 renormalisation), repeats are identical
    assert torch.cdist(out, stream[:n], p=1).min(1).values.max() < 1e-12
    assert torch.equal(out[n:], out[: n // 3])
    assert d.num_centroids == len({tuple(r.tolist()) for r in out})
    # one query at a time gives the same answers as batches (arrival order inside a batch)
    d1 = make_defense("modelguard_s", epsilon=eps)
    assert torch.equal(torch.cat([d1.defend(r[None]) for r in stream]), out)
    # the first centroid within ε is returned, not the nearest
    cents = d.state_dict()["centroids"]
    for r, a in zip(stream[:10], out[:10], strict=True):
        same = cents[cents.argmax(1) == r.argmax()]
        first = same[((same - r).abs().sum(1) <= eps).nonzero()[0, 0]]
        assert torch.equal(first, a)


def test_modelguard_s_state_roundtrip_and_frozen(tmp_path):
    g = torch.Generator().manual_seed(0)
    ys = torch.softmax(torch.randn(400, 6, generator=g) * 2, 1)
    d = make_defense("modelguard_s", epsilon=0.6)
    first = d.defend(ys)
    d.save(tmp_path / "s.safetensors")
    e = make_defense("modelguard_s", epsilon=0.6)
    e.load(tmp_path / "s.safetensors")
    assert e.num_centroids == d.num_centroids and e.centroid_counts() == d.centroid_counts()
    assert e.growth == d.growth and e.queries_seen == 400
    assert torch.equal(e.defend(ys), first)
    assert e.num_centroids == d.num_centroids
    fresh = torch.softmax(torch.randn(50, 6, generator=g) * 2, 1)
    n = e.num_centroids
    frozen = e.defend_frozen(fresh)
    assert e.num_centroids == n
    # the official frozen quantizer: the first centroid within ε, else the class's nearest centroid (beyond ε)
    cents, labels = e.state_dict()["centroids"].float(), e.state_dict()["labels"]
    dist = l1_distortion(fresh, frozen)
    for i in range(len(fresh)):
        same = cents[labels == fresh[i].argmax()]
        d_all = (same.double() - fresh[i].double()).abs().sum(1)
        assert torch.allclose(frozen[i], same[int(d_all.argmin())].to(frozen.dtype), atol=1e-6) or \
            d_all.min() <= 0.6 + 1e-6
        if d_all.min() > 0.6:
            assert dist[i] > 0.6 and abs(float(dist[i]) - float(d_all.min())) < 1e-5
    assert (dist > 0.6 + 1e-6).any()  # some fresh vectors are uncovered: the pBayes filter has work to do
    with pytest.raises(DataError):
        e.defend(torch.softmax(torch.randn(2, 5), 1))
    with pytest.raises(DataError):
        e.load_state_dict({"centroids": torch.zeros(2, 6)})


def _algorithm_1_reference(stream: np.ndarray, eps: float, ordered: bool) -> np.ndarray:
    """Algorithm 1 as a plain loop over each class's ordered centroid list (first, or nearest, within ε)."""
    lists: dict[int, list[np.ndarray]] = {}
    out = []
    for y in stream:
        cents = lists.setdefault(int(y.argmax()), [])
        d = [float(np.abs(c - y).sum()) for c in cents]
        hits = [i for i, di in enumerate(d) if di <= eps]
        if not hits:
            cents.append(y)
            out.append(y)
        else:
            out.append(cents[hits[0] if ordered else min(hits, key=lambda i: (d[i], i))])
    return np.stack(out)


@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("eps", [0.0, 0.05, 0.4, 1.2])
def test_modelguard_s_lookup_matches_the_plain_loop(eps, ordered, monkeypatch):
    """The float32 pre-filter is exact: same answers as the loop, incl. duplicates at ε = 0 and ℓ1 = ε ties."""
    import modelward.extraction.defenses.modelguard_s as mg_s

    g = torch.Generator().manual_seed(7)
    ys = torch.softmax(torch.randn(300, 5, generator=g, dtype=torch.float64) * 2, 1)
    coarse = torch.round(ys * 20) / 20 + 1e-3  # coarse values: exact repeats and distances exactly at ε
    ys = torch.cat([ys[:150], coarse[150:] / coarse[150:].sum(1, keepdim=True)])
    ys = torch.cat([ys, ys[::3]])
    ref = torch.from_numpy(_algorithm_1_reference(ys.numpy(), eps, ordered))
    for limit, block in ((1 << 15, 1024), (4, 2)):  # also the query-by-query path for many candidates
        monkeypatch.setattr(mg_s, "_EXACT_LIMIT", limit)
        monkeypatch.setattr(mg_s, "_EXACT_BLOCK", block)
        for bs in (1, 7, 64):
            d = make_defense("modelguard_s", epsilon=eps, ordered=ordered)
            out = torch.cat([d.defend(ys[i:i + bs]) for i in range(0, len(ys), bs)])
            assert torch.allclose(out, ref, atol=1e-15, rtol=0), (limit, bs)
            assert d.num_centroids == len({tuple(r.tolist()) for r in ref})


def test_non_ordered_quantizer_changes_answers_on_a_second_pass():
    """Table 6: nearest-centroid quantization is inconsistent under 2-QPI; ordered quantization never is."""
    g = torch.Generator().manual_seed(1)
    ys = torch.softmax(torch.randn(2000, 10, generator=g) * 1.5, 1)
    changed = {}
    for ordered in (True, False):
        d = make_defense("modelguard_s", epsilon=0.8, ordered=ordered)
        a, b = d.defend(ys), d.defend(ys)
        changed[ordered] = int((a != b).any(1).sum())
        assert (l1_distortion(ys, b) <= 0.8 + 1e-6).all()
    assert changed[True] == 0 and changed[False] > 0


def test_static_baselines():
    y = torch.tensor([[0.12, 0.31, 0.26, 0.31], [0.05, 0.05, 0.05, 0.85]], dtype=torch.float64)
    assert torch.allclose(make_defense("rounding").defend(y)[0], torch.tensor([0.1, 0.3, 0.3, 0.3], dtype=y.dtype))
    # plain rounding would sum to 0.9: the missing grid unit goes to the largest remainder (0.04 of class 0) ...
    r = make_defense("rounding", decimals=1).defend(torch.tensor([[0.34, 0.33, 0.33]], dtype=torch.float64))
    assert torch.allclose(r, torch.tensor([[0.4, 0.3, 0.3]], dtype=torch.float64))
    # ... and equal remainders go to the lower class indices
    q = make_defense("rounding", decimals=1).defend(torch.full((1, 4), 0.25, dtype=torch.float64))
    assert torch.allclose(q, torch.tensor([[0.3, 0.3, 0.2, 0.2]], dtype=torch.float64))
    assert torch.allclose(make_defense("rounding", decimals=0).defend(y), torch.eye(4, dtype=y.dtype)[[1, 3]])
    t = make_defense("top1").defend(y)
    assert torch.allclose(l1_distortion(y, t), 2 * (1 - y.max(1).values))
    rs = make_defense("reverse_sigmoid", beta=0.3, gamma=0.2).defend(y)
    assert is_in_simplex(rs).all() and not torch.allclose(rs, y)
    # random noise averages away under repeated queries (Remark 3)
    noise = make_defense("gaussian_noise", sigma=0.05, seed=0)
    reps = torch.stack([noise.defend(y) for _ in range(400)])
    assert (reps[0] != reps[1]).any() and (reps.mean(0) - y).abs().max() < 0.03
    again = make_defense("gaussian_noise", sigma=0.05, seed=0)
    assert torch.equal(again.defend(y), reps[0])


def test_mad_closed_form_matches_autograd_jacobian():
    torch.manual_seed(0)
    k = 5
    model, x = _inputs(3, k)
    model = model.double()
    y = torch.softmax(torch.randn(3, k, dtype=torch.float64) * 2, 1)
    mad = make_defense("mad", epsilon=0.8, surrogate=model)
    out = mad.defend(y, x.double())
    w = model.logits.weight
    for i in range(3):
        rows = []
        for c in range(k):
            nll = -torch.log_softmax(model(x[i:i + 1].double()), 1)[0, c]
            rows.append(torch.autograd.grad(nll, w)[0].flatten())
        G = torch.stack(rows)  # K × D

        def obj(v, G=G, i=i):
            a, b = G.T @ v, G.T @ y[i]
            return ((a / a.norm() - b / b.norm()) ** 2).sum()

        p = mad.surrogate_probs(x[i:i + 1].double())
        closed = _angular_objective(p, y[i:i + 1], out[i][None, None, :])[0, 0]
        assert torch.allclose(obj(out[i]), closed, atol=1e-9)
        assert obj(out[i]) > 0.0
    assert (l1_distortion(y, out) <= 0.8 + 1e-6).all() and top1_kept(y, out).all()


def test_mad_greedy_oracle_for_many_classes():
    model, x = _inputs(4, 14)
    y = torch.softmax(torch.randn(4, 14, generator=torch.Generator().manual_seed(2)) * 2, 1)
    out = make_defense("mad", epsilon=0.5, surrogate=model, max_evals=200).defend(y, x)
    assert is_in_simplex(out).all() and top1_kept(y, out).all()
    assert torch.allclose(l1_distortion(y, out), torch.full((4,), 0.5, dtype=torch.float64), atol=1e-5)


def test_adaptive_misinformation_switches_at_tau():
    model, x = _inputs(2, 4)
    am = make_defense("adaptive_misinformation", tau=0.5, nu=1000.0, misinformation=model)
    y = torch.tensor([[0.45, 0.2, 0.2, 0.15], [0.9, 0.05, 0.03, 0.02]])
    a = am.alpha(y.double())
    assert a[0] > 0.999 and a[1] < 1e-6
    out = am.defend(y, x)
    with torch.no_grad():
        mis = torch.softmax(model(x), 1)
    assert torch.allclose(out[0], mis[0], atol=1e-4) and torch.allclose(out[1], y[1], atol=1e-5)


def test_misinformation_training_lowers_true_class_probability():
    from modelward.extraction.defenses.adaptive_misinformation import train_misinformation_model

    g = torch.Generator().manual_seed(0)
    x = torch.rand(64, 1, 3, 3, generator=g)
    y = x.flatten(1)[:, :4].argmax(1)  # a learnable labelling
    model, _ = _inputs(1, 4)
    before = torch.softmax(model(x), 1).gather(1, y[:, None]).mean().item()
    train_misinformation_model(model, x, y, steps=100, lr=0.5, batch_size=32)
    after = torch.softmax(model(x), 1).gather(1, y[:, None]).mean().item()
    assert after < before / 2


def test_registry_errors_name_the_choices():
    with pytest.raises(ConfigError, match="valid choices"):
        make_defense("modelguard")
    with pytest.raises(ConfigError, match=r"unknown parameter\(s\) \[.eps.\]; valid: \[.epsilon."):
        make_defense("modelguard_w", eps=1.0)
    with pytest.raises(ConfigError, match="surrogate"):
        make_defense("mad", epsilon=1.0)
    with pytest.raises(ConfigError, match="epsilon"):
        make_defense("modelguard_s", epsilon=3.0)
    with pytest.raises(DataError):
        make_defense("top1").defend(torch.tensor([[0.5, float("nan")]]))
    with pytest.raises(DataError):
        make_defense("top1").defend(torch.tensor([[0.9, 0.9]]))


def test_modelguard_w_never_ties_the_top_class():
    with pytest.raises(ConfigError, match="margin"):
        make_defense("modelguard_w", epsilon=1.0, margin=0.0)
    g = torch.Generator().manual_seed(4)
    ys = torch.softmax(torch.randn(3000, 10, generator=g) * 1.5, 1)
    ys[:500, 1] = ys[:500, 0] = ys[:500, :2].mean(1)  # exact ties in y itself
    ys = ys / ys.sum(1, keepdim=True)
    for eps in (0.5, 1.0, 2.0):
        out = make_defense("modelguard_w", epsilon=eps, margin=1e-6).defend(ys).double()
        top = out.max(1).values
        second = out.topk(2, 1).values[:, 1]
        changed = (out - ys.double()).abs().sum(1) > 1e-9
        # every perturbed answer keeps y's top class strictly first; unperturbed ones are y itself
        assert (top[changed] > second[changed]).all()
        assert (out.argmax(1)[changed] == ys.argmax(1)[changed]).all()
        assert torch.allclose(out[~changed], ys.double()[~changed])
