import datetime as dt
import sys

import pytest

from modelward.core.config import allow_code, validate
from modelward.errors import ConfigError
from modelward.governance.audit import AuditLog
from modelward.governance.consent import ConsentChecker, PassRequest, Policy, in_window, purpose_of


def req(**kw):
    base = dict(party="bob", caller="alice", op="step", session="s", step=0, batch=32, split="test")
    base.update(kw)
    return PassRequest(purpose=purpose_of(base["op"]), **base)


@pytest.fixture()
def audit(tmp_path):
    a = AuditLog(tmp_path / "a.db", "bob")
    yield a
    a.close()


def test_default_policy_denies_everything(audit):
    c = ConsentChecker(Policy(), audit)
    for op in ("step", "eval", "predict", "commit"):
        d = c.check(req(op=op))
        assert not d.allowed and "allowed peer" in d.reason


def test_peer_purpose_and_batch(audit):
    c = ConsentChecker(Policy(allow_peers=["alice"], training=True, max_batch=16), audit)
    assert not c.check(req(caller="mallory")).allowed
    assert "inference is not allowed" in c.check(req(op="predict", batch=8)).reason
    assert "max_batch" in c.check(req(batch=32)).reason
    assert c.check(req(batch=16)).allowed


def test_step_limits_count_per_peer_from_the_audit_log(audit):
    c = ConsentChecker(Policy(allow_peers=["alice", "carol"], training=True, max_steps_per_session=2,
                              max_steps_per_day=3, max_steps_total=4, max_passes_per_day=6), audit)
    for i in range(2):
        assert c.check(req(step=i)).allowed
        audit.append("alice", "step", "s", i, i + 1, 32)
    d = c.check(req(step=2))
    assert not d.allowed and "max_steps_per_session" in d.reason
    assert c.check(req(session="other")).allowed  # a new session: the per-session limit only
    audit.append("alice", "step", "other", 0, 1, 32)
    d = c.check(req(session="third"))
    assert not d.allowed and "max_steps_per_day" in d.reason  # ... but not the daily one
    assert c.check(req(caller="carol")).allowed  # per peer
    for i in range(4):
        audit.append("carol", "eval", "x", 0, i + 1, 32)
    audit.append("carol", "step", "x", 0, 4, 32)
    audit.append("carol", "predict", "x", 0, 5, 32)
    d = c.check(req(caller="carol", op="eval", session="y"))
    assert not d.allowed and "max_passes_per_day" in d.reason
    assert c.check(req(op="status")).allowed and c.check(req(op="abort")).allowed  # no purpose: peer check only


def test_evaluation_is_on_the_test_split_unless_allowed(audit):
    c = ConsentChecker(Policy(allow_peers=["alice"], training=True), audit)
    assert c.check(req(op="eval", split="test")).allowed
    d = c.check(req(op="eval", split="train"))
    assert not d.allowed and "label oracle" in d.reason
    c = ConsentChecker(Policy(allow_peers=["alice"], training=True, eval_splits=["train", "test"]), audit)
    assert c.check(req(op="eval", split="train")).allowed


def test_the_purpose_is_the_operations_never_the_callers():
    assert purpose_of("step") == purpose_of("commit") == purpose_of("eval") == "train"
    assert purpose_of("predict") == purpose_of("fetch") == "inference"
    assert purpose_of("status") is None


def test_time_window(audit):
    assert in_window("08:00-18:00", dt.datetime(2024, 1, 1, 9, 0)) and not in_window("08:00-18:00",
                                                                                      dt.datetime(2024, 1, 1, 19))
    assert in_window("22:00-02:00", dt.datetime(2024, 1, 1, 1, 0))
    night = lambda: dt.datetime(2024, 1, 1, 23, 30, tzinfo=dt.UTC)  # noqa: E731
    c = ConsentChecker(Policy(allow_peers=["alice"], training=True, window_utc="08:00-18:00"), audit, now=night)
    assert "time window" in c.check(req()).reason


def test_python_hook_per_pass_and_per_session(audit, tmp_path, monkeypatch):
    (tmp_path / "myhooks.py").write_text("calls = []\ndef even(r):\n    calls.append(r)\n"
                                         "    return r['step'] % 2 == 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import myhooks

    calls = myhooks.calls
    pol = allow_code(Policy(allow_peers=["alice"], training=True, approval="myhooks:even", approval_scope="pass"))
    c = ConsentChecker(pol, audit)
    assert c.check(req(step=0)).allowed and not c.check(req(step=1)).allowed
    c2 = ConsentChecker(pol.model_copy(update={"approval_scope": "session"}), audit)
    assert c2.check(req(step=0)).allowed and c2.check(req(step=1)).allowed  # asked once per session
    assert len(calls) == 3


def test_command_hook(audit, tmp_path):
    script = tmp_path / "hook.py"
    script.write_text("import json,sys\nr=json.load(sys.stdin)\nprint('yes' if r['batch'] <= 8 else 'no')\n")
    pol = allow_code(Policy(allow_peers=["alice"], training=True, approval_command=[sys.executable, str(script)],
                            approval_scope="pass"))
    c = ConsentChecker(pol, audit)
    assert c.check(req(batch=8)).allowed
    d = c.check(req(batch=9))
    assert not d.allowed and "'no'" in d.reason


def test_policy_validation_errors():
    with pytest.raises(ConfigError, match="window_utc"):
        validate(Policy, {"window_utc": "8-18"}, "p.toml")
    with pytest.raises(ConfigError, match="unknown field"):
        validate(Policy, {"allow_peer": ["alice"]}, "p.toml")


def test_approval_code_in_a_policy_runs_only_when_trusted(audit, tmp_path, monkeypatch):
    """Issue 31 item 1: an approval hook or command is code named by a config; without trust_code it is refused
    before it is imported or run."""
    from modelward.core.entrypoints import trust_code
    from modelward.errors import UntrustedCodeError

    trust_code(False)
    marker = tmp_path / "ran"
    (tmp_path / "evilhook.py").write_text(f"open({str(marker)!r}, 'w').write('x')\ndef ok(r):\n    return True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UntrustedCodeError, match="policy.approval"):
        ConsentChecker(Policy(allow_peers=["alice"], approval="evilhook:ok"), audit)
    assert not marker.exists()  # refused before the import
    with pytest.raises(UntrustedCodeError, match="policy.approval_command"):
        ConsentChecker(Policy(allow_peers=["alice"], approval_command=["touch", str(marker)]), audit)
    assert not marker.exists()
    assert not validate(Policy, allow_code(Policy(allow_peers=["alice"])).model_dump()).code_trusted  # not written
