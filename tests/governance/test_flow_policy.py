"""The information-flow policy (issue 26): what may run and what may leave, read top to bottom by `admit`."""

import datetime as dt

import pytest
import torch

from modelward.core.config import validate
from modelward.errors import ConfigError
from modelward.extraction.defenses import l1_distortion
from modelward.governance.audit import AuditLog
from modelward.governance.consent import ConsentChecker, PassRequest, Policy, purpose_of
from modelward.governance.flow_policy import (
    FlowPolicy,
    FlowRequest,
    NoUsage,
    PredictFlow,
    Release,
    admit,
    as_labels,
    distinct_count,
    receiver_of,
)

# the audit log stamps records with the real clock, so "today" must be the real day (a fixed date passed only on it)
NOW = dt.datetime.now(dt.UTC)


@pytest.fixture()
def audit(tmp_path):
    a = AuditLog(tmp_path / "a.db", "bob")
    yield a
    a.close()


def test_the_owner_keeps_its_outputs_by_default():
    flow = FlowPolicy()
    assert receiver_of(flow.predict, "bob") == "bob"
    d = admit(flow, FlowRequest("fetch", "alice", "bob", 0), NoUsage())
    assert not d.allowed and "bob keeps its outputs" in d.reason and "result_receiver" in d.reason
    assert admit(flow, FlowRequest("fetch", "bob", "bob", 0), NoUsage()).allowed  # its own driver
    opted = FlowPolicy(predict=PredictFlow(result_receiver="carol"))
    assert admit(opted, FlowRequest("fetch", "carol", "bob", 0), NoUsage()).allowed
    assert not admit(opted, FlowRequest("fetch", "alice", "bob", 0), NoUsage()).allowed


def test_predict_on_the_training_split_is_refused_unless_allowed():
    d = admit(FlowPolicy(), FlowRequest("predict", "alice", "bob", 64, 64, "train"), NoUsage())
    assert not d.allowed and "predict.splits" in d.reason
    assert admit(FlowPolicy(), FlowRequest("predict", "alice", "bob", 64, 64, "test"), NoUsage()).allowed
    ok = FlowPolicy(predict=PredictFlow(splits=["train"]))
    assert admit(ok, FlowRequest("predict", "alice", "bob", 64, 64, "train"), NoUsage()).allowed


def test_eval_needs_distinct_indices_a_named_split_and_an_allowed_metric():
    flow = FlowPolicy(min_batch=8)
    idx = torch.full((8,), 17)  # the duplicate-index oracle: 8 copies of one row
    d = admit(flow, FlowRequest("eval", "alice", "bob", 8, distinct_count(idx), "test", "cross_entropy"),
              NoUsage())
    assert not d.allowed and "1 distinct" in d.reason and "min_batch" in d.reason
    idx = torch.arange(8)
    assert admit(flow, FlowRequest("eval", "alice", "bob", 8, distinct_count(idx), "test", "error"),
                 NoUsage()).allowed
    assert not admit(flow, FlowRequest("eval", "alice", "bob", 8, 8, "train", "error"), NoUsage()).allowed
    only_error = FlowPolicy(eval={"metrics": ["error"]})
    d = admit(only_error, FlowRequest("eval", "alice", "bob", 8, 8, "test", "cross_entropy"), NoUsage())
    assert not d.allowed and "eval.metrics" in d.reason


def test_row_budgets_count_rows_per_peer_from_the_audit_log(audit):
    flow = FlowPolicy(predict=PredictFlow(max_rows_per_day=100, max_rows_total=150))
    req = FlowRequest("predict", "alice", "bob", 64, 64, "test")
    assert admit(flow, req, audit, NOW).allowed
    audit.append("alice", "predict", batch=64)
    d = admit(flow, req, audit, NOW)  # 64 + 64 > 100: rows, not passes
    assert not d.allowed and "max_rows_per_day" in d.reason and "used 64" in d.reason
    assert admit(flow, FlowRequest("predict", "carol", "bob", 64, 64, "test"), audit, NOW).allowed  # per peer
    audit.append("alice", "predict", batch=30, decision="deny")  # refused rows are not spent
    assert admit(flow, FlowRequest("predict", "alice", "bob", 36, 36, "test"), audit, NOW).allowed
    tomorrow = NOW + dt.timedelta(days=1)
    assert admit(flow, req, audit, tomorrow).allowed  # a new day ...
    audit.append("alice", "predict", batch=64)
    d = admit(flow, FlowRequest("predict", "alice", "bob", 30, 30, "test"), audit, tomorrow)
    assert not d.allowed and "max_rows_total" in d.reason  # ... but not a new total
    eval_req = FlowRequest("eval", "alice", "bob", 64, 64, "test", "error")
    assert admit(FlowPolicy(eval={"max_rows_per_day": 64}), eval_req, audit, NOW).allowed  # its own budget


def test_consent_checks_the_flow_last(audit):
    c = ConsentChecker(Policy(allow_peers=["alice"], training=True, inference=True, min_batch=8), audit)

    def req(**kw):
        base = dict(party="bob", caller="alice", op="eval", session="s", step=0, batch=8, split="test")
        base.update(kw)
        return PassRequest(purpose=purpose_of(base["op"]), **base)

    assert c.check(req(distinct=8)).allowed
    assert "distinct" in c.check(req(distinct=1)).reason
    assert "predict.splits" in c.check(req(op="predict", split="train")).reason
    assert "keeps its outputs" in c.check(req(op="fetch", batch=0)).reason


def test_policy_tables_load_and_name_bad_fields():
    p = validate(Policy, {"allow_peers": ["alice"], "predict": {"result_receiver": "alice", "form": "topk",
                                                                "top_k": 2}}, "p.toml")
    assert p.predict.form == "topk" and p.eval.metrics == ["error", "cross_entropy"]
    with pytest.raises(ConfigError, match="predict.form"):
        validate(Policy, {"predict": {"form": "scores"}}, "p.toml")
    with pytest.raises(ConfigError, match="predict.epsilon"):
        validate(Policy, {"predict": {"epsilon": 3.0}}, "p.toml")


def test_release_forms_on_real_logits(tmp_path):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 10, generator=g) * 3
    top = logits.argmax(1)
    assert torch.equal(Release(PredictFlow(form="label")).release(logits)["labels"], top)
    tk = Release(PredictFlow(form="topk", top_k=3)).release(logits)["topk"]
    assert tk.shape == (64, 3) and torch.equal(tk[:, 0], top)
    assert torch.equal(Release(PredictFlow(form="logits")).release(logits)["logits"], logits)  # full trust only
    probs = Release(PredictFlow(form="probs")).release(logits)["probs"]
    torch.testing.assert_close(probs, torch.softmax(logits, 1))
    for form in ("modelguard_w", "modelguard_s"):
        out = Release(PredictFlow(form=form, epsilon=0.5), tmp_path / f"{form}.safetensors").release(logits)
        assert torch.equal(as_labels(out), top)  # ModelGuard keeps the top class (Eq. 6) ...
        assert (l1_distortion(probs, out["probs"]) <= 0.5 + 1e-4).all()  # ... within the owner's ε (Eq. 5)
        assert (l1_distortion(probs, out["probs"]) > 1e-3).any()  # and does perturb
    # ModelGuard-S keeps its centroids across a restart (its state file in the owner's folder)
    path = tmp_path / "modelguard_s.safetensors"
    again = Release(PredictFlow(form="modelguard_s", epsilon=0.5), path)
    assert again.defense.num_centroids > 0
