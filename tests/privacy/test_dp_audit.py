"""One-run DP audit (Steinke, Nasr & Jagielski 2023): the Appendix D statistics by hand, their validity under a
mechanism that is exactly ε-DP, the canaries' path through Opacus, and honest vs broken DP-SGD runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from modelward.errors import ConfigError, DataError
from modelward.privacy.dp_audit import (
    DPAuditConfig,
    audit_scores,
    epsilon_lower_bound_one_run,
    p_value_dp_audit,
    right_guesses,
    run_dp_audit,
)

SMALL = {"model": {"arch": "mlp", "hidden": [16], "batch_norm": False}, "epochs": 20, "lr": 1.0,
         "canaries": {"white_box": 300, "black_box": 40}, "guesses": [50, 100, 150], "target_epsilon": 1.0,
         "data": {"source": "digits", "max_samples": 600}}


def test_p_value_by_hand() -> None:
    # ε = 0, δ = 0: P[Bin(r, ½) ≥ v]
    assert p_value_dp_audit(100, 20, 15, 0.0, 0.0) == pytest.approx(stats.binom.sf(14, 20, 0.5))
    # ε = 1: q = e/(1+e)
    q = math.e / (1 + math.e)
    assert p_value_dp_audit(100, 20, 18, 1.0, 0.0) == pytest.approx(stats.binom.sf(17, 20, q))
    # δ term: + 2 m δ max_i P[v − i ≤ Bin < v]/i, written out for v = 2, r = 3
    pmf = stats.binom.pmf([1, 0], 3, q)
    alpha = max(pmf[0] / 1, (pmf[0] + pmf[1]) / 2)
    assert p_value_dp_audit(10, 3, 2, 1.0, 0.01) == pytest.approx(stats.binom.sf(1, 3, q) + alpha * 0.01 * 20)


def test_bound_is_the_largest_rejected_epsilon() -> None:
    eps = epsilon_lower_bound_one_run(1000, 200, 180, 1e-5)
    assert p_value_dp_audit(1000, 200, 180, eps, 1e-5) < 0.05 <= p_value_dp_audit(1000, 200, 180, eps + 1e-3, 1e-5)
    assert epsilon_lower_bound_one_run(1000, 200, 100, 1e-5) == 0.0  # chance level proves nothing
    # more right guesses, more canaries guessed, less δ: larger bounds
    assert epsilon_lower_bound_one_run(1000, 200, 190, 0) > eps > epsilon_lower_bound_one_run(1000, 200, 170, 0)
    assert epsilon_lower_bound_one_run(1000, 200, 180, 1e-3) < eps


def test_bound_is_valid_against_an_exactly_eps_dp_mechanism() -> None:
    # the attack on the audit itself: randomised response with ε = 1 is exactly ε-DP; an audit that claims
    # ε_lb > 1 more than 5 % of the time would accuse an honest mechanism
    rng = np.random.default_rng(0)
    q = math.e / (1 + math.e)
    m, runs, above = 400, 400, 0
    for _ in range(runs):
        inc = rng.random(m) < 0.5
        said_in = np.where(rng.random(m) < q, inc, ~inc)  # each bit released by ε-DP randomised response
        scores = said_in + 1e-3 * rng.random(m)  # ranked by the released bit
        v = right_guesses(scores, inc, 100)
        # ε_lb > 1 ⇔ the p-value at ε = 1 is below 5 % (the bound is the largest ε rejected; monotone in ε)
        above += p_value_dp_audit(m, 200, v, 1.0, 0.0) < 0.05
    assert above <= 0.05 * runs + 8  # 5 % plus ~2 binomial standard deviations
    inc = rng.random(m) < 0.5
    said_in = np.where(rng.random(m) < q, inc, ~inc)
    assert audit_scores(said_in + 1e-3 * rng.random(m), inc, 0.0, [100]).epsilon_lb < 1.5
    # and a strong signal does give a large bound
    inc = rng.random(m) < 0.5
    assert audit_scores(inc + rng.random(m) * 0.1, inc, 0.0, [50, 100, 200]).epsilon_lb > 3


def test_guesser_errors() -> None:
    with pytest.raises(ConfigError, match="guesses"):
        audit_scores(np.zeros(10), np.zeros(10, bool), 0.0, [20])
    with pytest.raises(DataError, match="inclusion"):
        audit_scores(np.zeros(10), np.zeros(9, bool), 0.0, [2])
    with pytest.raises(ValueError, match="exactly one"):
        DPAuditConfig(target_epsilon=None)


def test_dirac_canaries_go_through_the_optimizer() -> None:
    # little noise (σ = 0.5, sum over 5 full-batch steps: sd 1.1 vs a shift of 5): an included canary adds C at
    # every step, an excluded one nothing
    cfg = DPAuditConfig(**(SMALL | {"target_epsilon": None, "noise_multiplier": 0.5, "epochs": 5,
                                    "canaries": {"white_box": 50, "black_box": 0}, "guesses": [10]}))
    rows = run_dp_audit(cfg)
    assert rows[0].variant == "white-box" and rows[0].steps == 5 and rows[0].sample_rate == 1.0
    assert rows[0].correct == rows[0].guesses == 20


def test_honest_run_is_consistent_and_broken_run_is_caught(tmp_path) -> None:
    honest = run_dp_audit(DPAuditConfig(**SMALL), tmp_path / "honest")
    broken = run_dp_audit(DPAuditConfig(**(SMALL | {"noise_divisor": 8.0})), tmp_path / "broken")
    wb_h, wb_b = honest[0], broken[0]
    assert wb_h.claimed_epsilon == pytest.approx(1.0, abs=0.02) and wb_b.claimed_epsilon == wb_h.claimed_epsilon
    assert wb_h.consistent, wb_h.text()
    assert not wb_b.consistent and wb_b.epsilon_lb > 1.5, wb_b.text()
    assert wb_b.trained_noise_epsilon > 5 * wb_b.claimed_epsilon  # what the noise really gave
    assert {r.variant for r in honest} == {"white-box", "black-box"}
    assert (tmp_path / "honest" / "results.md").is_file()
    s = np.load(tmp_path / "broken" / "canaries" / "white-box.scores.npy")
    inc = np.load(tmp_path / "broken" / "canaries" / "white-box.members.npy")
    assert audit_scores(s, inc, wb_b.delta, [50, 100, 150]).epsilon_lb == pytest.approx(wb_b.epsilon_lb)
