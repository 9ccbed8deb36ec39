"""The neighbour extraction harness (issue 26 item 3) on a real trained split, through an oracle that answers as a
party under a flow policy does: open, the attacks of the issue work; under the default policy, they are refused."""


import pytest
import torch
import torch.nn.functional as F

from modelward.core.data import DataConfig, load_data
from modelward.core.init import init_model_
from modelward.core.train import TrainConfig, batch_order, make_optimizer
from modelward.core.zoo import ModelConfig, build_model
from modelward.governance.audit import AuditLog
from modelward.governance.consent import ConsentChecker, PassRequest, Policy, purpose_of
from modelward.governance.flow_policy import PredictFlow, Release, distinct_count
from modelward.governance.neighbour_audit import (
    Victim,
    Withheld,
    completion_rows,
    eval_differencing_curve,
    eval_oracle_curve,
    gradient_label_recovery,
    label_only_curve,
    labels_from_answers,
    loss_oracle,
    query_pool,
    surrogate_curve,
    write_extraction,
)
from modelward.governance.party.label_protection import LabelProtectionConfig, protect_gradient
from modelward.governance.party.release import ReleasePath
from modelward.governance.plan import segment_of
from modelward.governance.wire import WireError

MODEL = ModelConfig(arch="cnn", channels=[8, 16], fc=32)
BOB = ["conv2", "fc1", "logits"]


class PolicyOracle:
    """Bob's answers to a neighbour, through the same checks a party makes (consent + flow policy, counted from a
    real audit log) and the same release of what leaves."""

    def __init__(self, bob, y_train, y_test, policy: Policy, audit: AuditLog, driver: str = "alice"):
        self.bob, self.y = bob, {"train": y_train, "test": y_test}
        self.checker, self.audit, self.driver = ConsentChecker(policy, audit), audit, driver
        self.release = Release(policy.predict)

    def _ask(self, op, rows, split, idx=None, metric="error", caller="alice"):
        d = self.checker.check(PassRequest("bob", caller, op, purpose_of(op), "s", 0, rows, split,
                                           distinct_count(idx) if idx is not None else -1, metric))
        if not d.allowed:
            self.audit.append(caller, op, batch=rows, decision="deny", reason=d.reason, durable=False)
            from modelward.governance.protocol import ConsentDenied

            raise ConsentDenied(d.reason)
        # (durable=False: a party syncs its data passes' records in the background too; one fsync per query would
        # be most of these tests' time)
        self.audit.append(caller, op, batch=rows, decision="allow", reason=d.reason, durable=False)

    def predict(self, h, split="test", idx=None):
        self._ask("predict", len(h), split, idx)
        with torch.no_grad():
            logits = self.bob(h)
        self._ask("fetch", 0, "", caller=self.driver)  # the driver (alice's key) collects the result
        return self.release.release(logits)

    def eval_sum(self, h, idx, split, metric):
        self._ask("eval", len(h), split, idx, metric)
        with torch.no_grad():
            return float(F.cross_entropy(self.bob(h), self.y[split][idx], reduction="sum"))


class ReleaseOracle(PolicyOracle):
    """Bob's answers through a party's release path (``path``), or, with ``path=None``, as the party of issue 36
    answered: exact sums, and the step's loss in its answer before the step is aborted."""

    def __init__(self, *args, path: ReleasePath | None = None, **kw):
        super().__init__(*args, **kw)
        self.path, self.steps = path, 0

    def eval_sum(self, h, idx, split, metric):
        self._ask("eval", len(h), split, idx, metric)
        with torch.no_grad():
            out, y = self.bob(h), self.y[split][idx]
            rows = (out.argmax(1) != y).double() if metric == "error" else F.cross_entropy(out, y, reduction="none")
        if self.path is None:
            return float(rows.sum())
        r = self.path.release("alice", "eval_sum", rows, idx=idx, metric=metric, session="s")
        if r.value is None:
            raise Withheld(r.note)
        return r.value

    def train_step(self, h, idx, commit=False):
        self._ask("step", len(h), "train", idx)
        with torch.no_grad():  # (bob's parameters are not updated here: the levels the attacker reads stay put)
            rows = F.cross_entropy(self.bob(h), self.y["train"][idx], reduction="none")
        if self.path is None:
            return float(rows.mean())  # issue 36: the step's loss came back, then the operator aborted the step
        self.steps += 1
        self.path.hold_loss(self.steps, rows, float(rows.mean()), idx)
        if not commit:
            self.path.aborted(self.steps)
            return None
        self.path.committed(self.steps)
        r = self.path.release("alice", "train_loss", None)
        return None if r.value is None else r.value["mean"]


@pytest.fixture(scope="module")
def split():
    torch.manual_seed(0)
    data = load_data(DataConfig(source="digits", seed=0))
    full = init_model_(build_model(MODEL, (1, 8, 8), 10), "glorot_uniform", 0)
    alice, bob = segment_of(full, ["conv1"]), segment_of(full, BOB)
    opt = make_optimizer(list(full.parameters()), TrainConfig(lr=0.05, momentum=0.9))
    order = batch_order(len(data.x_train), 64, 0)
    for _ in range(100):
        idx = next(order)
        loss = F.cross_entropy(full(data.x_train[idx]), data.y_train[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    full.eval()
    with torch.no_grad():
        h_train, h_test = alice(data.x_train), alice(data.x_test)

    def fresh():
        return segment_of(init_model_(build_model(MODEL, (1, 8, 8), 10), "glorot_uniform",
                                      int(torch.randint(1 << 30, ()))), BOB)

    victim = Victim("bob", bob, fresh, 10)
    return data, bob, h_train, h_test, victim


def _oracle(split, tmp_path, name, **policy):
    data, bob, *_ = split
    pol = Policy(allow_peers=["alice"], training=True, inference=True, **policy)
    return PolicyOracle(bob, data.y_train, data.y_test, pol, AuditLog(tmp_path / f"{name}.db", "bob"))


def test_the_issue_s_attacks_work_on_an_open_policy(split, tmp_path):
    data, _, h_train, h_test, victim = split
    open_ = _oracle(split, tmp_path, "open", eval_splits=["test"],
                    predict=PredictFlow(result_receiver="alice", form="probs", splits=["train", "test"]))
    got = surrogate_curve(open_, victim, query_pool("natural", h_train, 256), h_test, [64, 256], fit_steps=200)
    pts = [p for p in got if p.attack == "predict_natural"]
    assert [p.rows for p in pts] == [64, 256] and not any(p.refused for p in got)
    assert [p.rows for p in got if p.attack == "predict_natural_top1"] == [64, 256]  # soft answers read as top-1
    assert pts[0].agreement > 0.6 > pts[0].chance + 0.3  # one predict of 64 rows copies most of bob's part
    assert pts[1].agreement > pts[0].agreement
    known = {int(c): int((data.y_test == c).nonzero()[0]) for c in range(10)}
    ev = [p for p in eval_oracle_curve(open_, victim, query_pool("natural", h_train, 40), h_test, known,
                                       [80 * 20, 80 * 40], fit_steps=200) if p.attack == "eval_oracle"]
    assert ev[-1].rows == 3200 and ev[-1].agreement > 0.6  # soft labels from duplicated eval rows
    lab = labels_from_answers(open_, h_train, data.y_train, 256, "bob")
    assert lab.agreement > 0.9 and not lab.refused  # predictions on the training split are its labels


def test_the_default_policy_refuses_them(split, tmp_path):
    data, _, h_train, h_test, victim = split
    safe = _oracle(split, tmp_path, "safe", min_batch=8)
    pts = surrogate_curve(safe, victim, query_pool("natural", h_train, 256), h_test, [64, 256])
    assert len(pts) == 1 and pts[0].refused and pts[0].rows == 0 and pts[0].agreement == pts[0].chance
    assert "keeps its outputs" in pts[0].note
    known = {int(c): int((data.y_test == c).nonzero()[0]) for c in range(10)}
    ev = eval_oracle_curve(safe, victim, query_pool("natural", h_train, 10), h_test, known, [800])
    assert ev[0].refused and ev[0].rows == 0 and "distinct" in ev[0].note
    lab = labels_from_answers(safe, h_train, data.y_train, 256, "bob")
    assert lab.refused and lab.rows == 0 and "predict.splits" in lab.note
    # the owner opts in to labels for alice, within a row budget: the curve stops where the budget does
    budget = _oracle(split, tmp_path, "budget", predict=PredictFlow(result_receiver="alice", max_rows_per_day=128))
    pts = surrogate_curve(budget, victim, query_pool("augmented", h_train, 512), h_test, [64, 128, 512],
                          fit_steps=100)
    assert [p.rows for p in pts] == [64, 128, 128] and pts[-1].refused and "max_rows_per_day" in pts[-1].note


def test_gradient_labels_are_recovered_without_protection_and_not_with_marvell(split):
    data, bob, h_train, *_ = split
    idx = torch.arange(512)
    h = h_train[idx].clone().requires_grad_(True)
    F.cross_entropy(bob(h), data.y_train[idx]).backward()
    got, chance = gradient_label_recovery(h.grad, data.y_train[idx], 10)
    assert got > 0.6 and chance < 0.25
    noisy = torch.cat([protect_gradient(h.grad[i:i + 64], data.y_train[idx][i:i + 64],
                                        LabelProtectionConfig(method="marvell", scale=4.0, seed=1))
                       for i in range(0, 512, 64)])
    got_protected, _ = gradient_label_recovery(noisy, data.y_train[idx], 10)
    assert got_protected < got - 0.3


def test_completion_cost_and_the_report_files(split, tmp_path):
    data, _, h_train, h_test, victim = split
    rows = completion_rows(victim, h_train, data.y_train, h_test, 0.9, max_steps=400)
    assert rows is not None and rows % 64 == 0 and rows > 64
    pts = surrogate_curve(_oracle(split, tmp_path, "r", predict=PredictFlow(result_receiver="alice")), victim,
                          query_pool("synthetic", h_train, 128), h_test, [64, 128], fit_steps=50)
    paths = write_extraction(tmp_path / "out", pts, {"completion_rows": {"bob": rows}})
    head = paths["csv"].read_text().splitlines()[0]
    assert head.startswith("part,attack,rows,agreement,refused") and paths["png"].stat().st_size > 1000
    with pytest.raises(WireError.__mro__[1]):  # a ModelwardError: an unknown pool is named
        query_pool("adversarial", h_train, 8)


def _composition(split, tmp_path, name, path):
    data, bob, *_ = split
    pol = Policy(allow_peers=["alice"], training=True, inference=True, min_batch=8)
    return ReleaseOracle(bob, data.y_train, data.y_test, pol, AuditLog(tmp_path / f"{name}.db", "bob"), path=path)


def test_issue_36_s_composition_attacks_work_on_the_old_party_and_fail_through_the_release_path(split, tmp_path):
    """The three attacks of issue 36 through the same harness the audit runs: against a party that answers as the
    old one did (exact sums, the step's loss before the abort) they copy Bob's part or read his labels; through
    the release path under the default policy they get noise, then nothing."""
    data, _, h_train, h_test, victim = split
    fixed_idx = torch.arange(7)
    known = {c: int((data.y_test[7:] == c).nonzero()[0]) + 7 for c in range(10)}
    known_train = {c: int((data.y_train == c).nonzero()[0]) for c in range(10)}
    fixed_h, probe_h = h_train[100:107], h_train[200]
    pool = query_pool("natural", h_train, 512)
    probes = torch.arange(300, 340)
    old = _composition(split, tmp_path, "old", None)
    diff = eval_differencing_curve(old, victim, pool, h_test, fixed_h, fixed_idx, known, [80 * 64], fit_steps=200)
    labels = label_only_curve(old, victim, pool, h_test, fixed_h, fixed_idx, known, [3000], fit_steps=150,
                              refit=32)
    loss = loss_oracle(old, probes, data.y_train, fixed_h, torch.arange(1000, 1007), probe_h, known_train, "bob")
    assert diff[0].agreement > 0.6 > diff[0].chance + 0.3, diff  # issue: 0.908 from 5,120 rows
    assert labels[0].agreement > 0.6 and not labels[0].refused, labels  # issue: 0.914 from 2,984 rows
    assert loss.agreement > 0.95 and loss.rows == 8 * 50, loss  # issue: 400 of 400 labels
    new = _composition(split, tmp_path, "new", ReleasePath("bob", Policy(), None, seed=0))
    diff = eval_differencing_curve(new, victim, pool, h_test, fixed_h, fixed_idx, known, [80 * 24], fit_steps=200)
    assert diff[-1].refused and diff[-1].rows < 80 * 24 and diff[-1].agreement < 0.3, diff
    assert "privacy budget" in diff[-1].note
    new = _composition(split, tmp_path, "new2", ReleasePath("bob", Policy(), None, seed=1))
    labels = label_only_curve(new, victim, pool, h_test, fixed_h, fixed_idx, known, [600], fit_steps=200)
    assert labels[-1].refused and labels[-1].agreement < 0.3, labels
    loss = loss_oracle(new, probes, data.y_train, fixed_h, torch.arange(1000, 1007), probe_h, known_train, "bob")
    assert loss.agreement <= loss.chance + 0.1 and "no loss released" in loss.note, loss  # aborted: nothing left
    committed = loss_oracle(new, probes, data.y_train, fixed_h, torch.arange(1000, 1007), probe_h, known_train,
                            "bob", commit=True)
    assert committed.agreement < 0.3, committed  # committed windows: noise, then the budget (spent above)
