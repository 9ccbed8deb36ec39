"""The release path on its own: its unit tests are the composition attacks of issue 36 (fixed rows + a probe, a
step then an abort, S against S plus one row), each run against the mechanism with the owner's opt-out (where it
works) and under the defaults (where it must fail by construction), and the accountant checked against Opacus."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from modelward.governance.audit import AuditLog
from modelward.governance.flow_policy import FlowPolicy, PredictFlow, Release
from modelward.governance.party.release import (
    KINDS,
    Ledger,
    Released,
    ReleasePath,
    gdp_epsilon,
    gdp_mu,
    parse_charges,
)

K, D = 10, 16


def _bob(seed: int = 0):
    """A stand-in for Bob's part (a linear layer on 16-dim activations, 10 classes) and his test labels."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(K, D, generator=g)
    y = torch.randint(K, (64,), generator=g)
    return (lambda h: h @ w.T), y


def _path(policy: FlowPolicy | None = None, **kw) -> ReleasePath:
    return ReleasePath("bob", policy or FlowPolicy(), ledger=None, seed=kw.pop("seed", 0), **kw)


def _exact() -> FlowPolicy:
    return FlowPolicy.model_validate({"eval": {"noise": 0}, "train_loss": {"noise": 0}})


def _differencing(path: ReleasePath, f, y, probe: torch.Tensor, fixed: torch.Tensor, known: dict[int, int],
                  session: str = "s") -> torch.Tensor | None:
    """Issue 36's eval differencing: 7 fixed rows and one probe row, one pass per class c (the probe on a test
    index of known class c); the answers differ only in the probe's cross-entropy, so softmax(-answers) is the
    victim's softmax at the probe. Returns it, or None once an answer is withheld."""
    ans = []
    for c in range(K):
        h = torch.cat([fixed, probe[None]])
        idx = torch.cat([torch.arange(7), torch.tensor([known[c]])])
        per_row = F.cross_entropy(f(h), y[idx], reduction="none")
        r = path.release("alice", "eval_sum", per_row, idx=idx, metric="cross_entropy",
                         exact=float(per_row.sum()), session=session)
        if r.value is None:
            return None
        ans.append(r.value)
    return torch.softmax(-torch.tensor(ans, dtype=torch.float64), 0)


def test_eval_differencing_recovers_the_exact_softmax_only_with_the_owner_s_opt_out():
    f, y = _bob()
    g = torch.Generator().manual_seed(1)
    fixed = torch.randn(7, D, generator=g)
    known = {c: int((y[7:] == c).nonzero()[0]) + 7 for c in range(K)}
    probes = torch.randn(3, D, generator=g)
    # the owner's opt-out (noise = 0): the attack, exact (it measured an error of 3.5e-10)
    exact = _path(_exact())
    for p in probes:
        got = _differencing(exact, f, y, p, fixed, known)
        assert (got - torch.softmax(f(p[None])[0].double(), 0)).abs().max() < 1e-5
    # the defaults: every answer carries N(0, (4 x 4 nats)^2), against a probe that moves it by at most 4 nats
    path = _path()
    errors, got_any = [], 0
    for i in range(40):
        p = torch.randn(D, generator=g)
        est = _differencing(path, f, y, p, fixed, known, session=f"s{i}")
        if est is None:
            break
        got_any += 1
        errors.append(float((est.log() - F.log_softmax(f(p[None])[0].double(), 0)).abs().mean()))
    # 37 answers fit the default budget (epsilon 8 per day at delta 1e-6, noise multiplier 4): 3 probes of 10
    assert got_any == 3
    assert min(errors) > 3.0, errors  # the recovered log-softmax is noise (nats off on average)
    r = path.release("alice", "eval_sum", torch.zeros(8), idx=torch.arange(8), metric="error")
    assert r.value is None and "privacy budget today is spent" in r.note


def test_the_noise_is_calibrated_to_one_row_whatever_the_receiver_chose():
    """S against S plus one row: the released sums are the exact clipped sum plus N(0, (sigma*C*m)^2), m the most
    times one index occurs; so the difference any one row makes (at most C per occurrence) is a fraction 1/sigma
    of the noise, whatever the activations."""
    policy = FlowPolicy.model_validate({"privacy": {"epsilon_per_day": 1e4}, "eval": {"max_answers_per_day": None}})
    path = _path(policy)
    per_row = torch.full((8,), 100.0)  # far above the clip: counts as C = 4 each
    draws = torch.tensor([path.release("alice", "eval_sum", per_row, idx=torch.arange(8), metric="cross_entropy",
                                       session=str(i)).value for i in range(400)])
    assert abs(float(draws.mean()) - 8 * 4.0) < 4 * 16 / 20 * 3  # centred on the clipped sum (3 standard errors)
    assert 0.85 * 16 < float(draws.std()) < 1.15 * 16  # sd = sigma x C = 4 x 4
    # one index eight more times: one label moves the sum by up to 9 C, and the noise grows with it
    idx = torch.cat([torch.arange(8), torch.zeros(8, dtype=torch.long)])
    dup = torch.tensor([path.release("alice", "eval_sum", torch.ones(16), idx=idx, metric="error",
                                     session=f"d{i}").value for i in range(400)])
    assert 0.85 * 4 * 9 < float(dup.std()) < 1.15 * 4 * 9  # error rows: C = 1, m = 9


def test_the_loss_of_an_aborted_step_never_leaves():
    """Issue 36's training-loss label oracle: a step whose loss came back before the operator aborted it. The
    step's loss is held until its commit; an aborted step's is dropped, so nothing of it can be read later."""
    path = _path(_exact())
    y = torch.arange(8) % K
    for label_of_probe in range(K):  # the probe row's label changes the step's loss...
        logits = torch.zeros(8, K)
        logits[:, 3] = 5.0
        rows = F.cross_entropy(logits, torch.cat([y[:7], torch.tensor([label_of_probe])]), reduction="none")
        path.hold_loss(0, rows, float(rows.mean()), torch.arange(8))
        path.aborted(0)  # ...but the operator aborts it
    r = path.release("alice", "train_loss", None)
    assert r.value is None and "no step committed" in r.note
    # committed steps leave summed, once, with the next evaluation's answer
    path.hold_loss(0, torch.full((8,), 2.0), 2.0, torch.arange(8))
    path.hold_loss(1, torch.full((8,), 1.0), 1.0, torch.arange(8, 16))
    path.committed(1)
    r = path.release("alice", "train_loss", None)
    assert r.value == {"mean": 1.5, "steps": 2, "rows": 16}
    assert path.release("alice", "train_loss", None).value is None  # (not twice)


def test_committed_windows_leave_with_noise_on_their_rows():
    path = _path()
    for s in range(20):  # a window of 20 steps x 64 rows, each loss 1.0 nat
        path.hold_loss(s, torch.ones(64), 1.0, torch.arange(64 * s, 64 * (s + 1)))
    path.committed(19)
    r = path.release("alice", "train_loss", None)
    assert r.value["steps"] == 20 and r.value["rows"] == 1280
    assert abs(r.value["mean"] - 1.0) < 5 * 8 * 4 / 1280  # sd of the mean: sigma 8 x C 4 / 1280 rows
    assert "gaussian sd 32" in r.note and 'release:{"k":"train_loss","a":1,"mu2":0.015625}' in path.note


def test_parts_of_one_evaluation_leave_as_one_answer():
    path = _path(_exact())
    a = path.release("alice", "eval_sum", torch.ones(8), idx=torch.arange(8), metric="error", session="s",
                     part=(0, 2))
    b = path.release("alice", "eval_sum", torch.zeros(8), idx=torch.arange(8, 16), metric="error", session="s",
                     part=(1, 2))
    assert a.value is None and b.value == 8.0
    assert path.ledger.today("alice").answers == 1  # charged once
    # a part out of turn starts nothing (no free partial sums)
    c = path.release("alice", "eval_sum", torch.ones(8), idx=torch.arange(8), metric="error", session="s",
                     part=(1, 2))
    assert c.value is None and "without parts" in c.note


def test_answer_budgets_withhold_and_the_charges_survive_a_restart(tmp_path):
    log = AuditLog(tmp_path / "audit.db", "bob")
    try:
        policy = FlowPolicy.model_validate({"eval": {"max_answers_per_day": 3}})
        path = ReleasePath("bob", policy, log, seed=0)
        for i in range(4):
            r = path.release("alice", "eval_sum", torch.zeros(8), idx=torch.arange(8), metric="error",
                             session=str(i))
            # the gate writes the request's record with the party's note: the charge is in that record
            log.append("alice", "eval", batch=8, decision="allow" if r.value is not None else "allow",
                       reason="policy" + path.note)
            path.note = ""
        assert r.value is None and "max_answers_per_day" in r.note
        log.append("carol", "eval", batch=8, reason='policy release:{"k":"eval_sum","a":5,"mu2":1}')
        log.append("alice", "eval", batch=8, reason='forged release:{"k":"eval_sum","a":-50,"mu2":-9}')
        again = Ledger(log)  # a restarted party reads its charges back from the log
        assert again.today("alice").answers == 3 and again.today("alice").mu2 == pytest.approx(3 / 16)
        assert again.today("carol").answers == 5
    finally:
        log.close()
    assert parse_charges('x release:{"k":"eval_sum","a":-3,"mu2":-1} release:{"k":"p","a":2,"mu2":0.5}') == \
        [("eval_sum", 0, 0.0), ("p", 2, 0.5)]


def test_a_reply_takes_only_released_values():
    path = _path()
    with pytest.raises(TypeError, match="did not pass the release path"):
        path.reply("eval", meta={"sum": 3.0})
    withheld = Released("eval_sum", None, "budget spent")
    msg = path.reply("eval", meta={"sum": withheld, "n": path.release("alice", "status", 8)})
    assert msg.meta == {"n": 8, "withheld": "sum: budget spent"}
    assert set(KINDS) == {"gradient", "activation", "eval_sum", "train_loss", "prediction", "relay", "status"}
    with pytest.raises(KeyError, match="valid"):
        path.release("alice", "logits", torch.zeros(1))


def test_predictions_leave_in_the_owner_s_form_within_their_answer_budget():
    policy = FlowPolicy.model_validate({"predict": {"form": "label", "max_answers_per_day": 1}})
    path = ReleasePath("bob", policy, None, predict=Release(PredictFlow(form="label")), seed=0)
    out = path.release("operator", "prediction", torch.tensor([[0.1, 2.0], [3.0, 0.0]]))
    assert torch.equal(out.value["labels"], torch.tensor([1, 0]))
    assert path.release("operator", "prediction", torch.zeros(1, 2)).value is None


def test_the_accountant_is_mu_gdp_and_agrees_with_its_definition():
    # mu-GDP composes: n answers at noise multiplier sigma are (sqrt(n)/sigma)-GDP; its delta(epsilon) is the
    # tradeoff of two unit Gaussians mu apart (Dong, Roth & Su 2022, Cor. 2.13), here checked by its own definition
    mu = math.sqrt(20) / 4
    eps = gdp_epsilon(mu, 1e-6)
    from scipy.stats import norm

    delta = norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)
    assert delta == pytest.approx(1e-6, rel=1e-3)
    assert gdp_mu(eps, 1e-6) == pytest.approx(mu, rel=1e-6)
    assert gdp_epsilon(0.0, 1e-6) == 0.0


@pytest.mark.slow  # (importing opacus costs several seconds)
def test_the_accountant_agrees_with_opacus():
    from opacus.accountants import PRVAccountant, RDPAccountant

    for sigma, steps in ((4.0, 20), (8.0, 10), (2.0, 5), (4.0, 37)):
        prv, rdp = PRVAccountant(), RDPAccountant()
        prv.history = rdp.history = [(sigma, 1.0, steps)]
        ours = gdp_epsilon(math.sqrt(steps) / sigma, 1e-6)
        with pytest.warns(RuntimeWarning):  # (opacus' PRV at sample rate 1: a log(0) it handles)
            ref = prv.get_epsilon(delta=1e-6)
        assert ours == pytest.approx(ref, abs=0.05), (sigma, steps)  # PRV: numerically tight for Gaussians
        assert ours <= rdp.get_epsilon(delta=1e-6) + 1e-9  # RDP: an upper bound
