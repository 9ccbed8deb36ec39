"""The gate's checks, one at a time, each around a stub `call_next` (what the next check or the dispatch would do),
with a real audit log and a real consent checker; then the whole chain around a stub handler.

For every check: what it lets through reaches `call_next` unchanged, and what it refuses never does, is recorded
in the audit log, and raises the error class the transport maps to a status code."""

from __future__ import annotations

import threading

import pytest
import torch

from modelward.errors import ModelwardError
from modelward.governance.audit import AuditLog
from modelward.governance.consent import ConsentChecker, Policy
from modelward.governance.party import gate as g
from modelward.governance.party.gate import Gate, Request
from modelward.governance.protocol import ConsentDenied, PartyError
from modelward.governance.wire import Message, WireError, decode, encode


class StubHandler:
    """Records what the gate asks of it; answers every operation with an empty reply of the same op."""

    def __init__(self) -> None:
        self.note = ""
        self.calls: list[tuple] = []
        self.fail: BaseException | None = None

    def settle(self) -> None:
        self.calls.append(("settle",))

    def dispatch(self, op: str, msg: Message, caller: str) -> Message:
        self.calls.append(("dispatch", op, caller))
        if self.fail is not None:
            raise self.fail
        return Message(op, meta={"done": op})


@pytest.fixture()
def gate(tmp_path):
    log = AuditLog(tmp_path / "audit.db", "bob")
    policy = Policy(allow_peers=["alice", "driver"], training=True, inference=True, max_batch=64)
    gt = Gate(StubHandler(), name="bob", driver="driver", prev="alice", audit=log, consent=ConsentChecker(policy, log),
              lock=threading.RLock(), max_message_bytes=2**20, refusals_every_s=0.0, max_sessions_per_peer=4)
    yield gt
    log.close()


def records(gate: Gate) -> list[tuple[str, str, str, str]]:
    return gate.audit.db.execute("SELECT caller, op, decision, reason FROM audit ORDER BY id").fetchall()


def step_bytes(seq: int = 1, batch: int = 4, session: str = "s1", op: str = "step") -> bytes:
    return encode(Message(op, session, 0, seq, {}, {"idx": torch.arange(batch)}))


def decoded(gate: Gate, caller: str, data: bytes) -> Request:
    """A request as the checks after decode_body see it."""
    return g.decode_body(gate, Request(caller, data), lambda r: r)


class Stub:
    """A `call_next` that records its calls and returns `answer`."""

    def __init__(self, answer=b"answer") -> None:
        self.answer, self.seen = answer, []

    def __call__(self, req: Request):
        self.seen.append(req)
        return self.answer


def test_the_checks_run_in_the_documented_order():
    assert g.CHECKS == (g.peer_pin, g.decode_body, g.op_known, g.in_order, g.role, g.sequence_cache, g.consent,
                        g.audit)


def test_peer_pin_refuses_an_unpinned_caller_before_decoding(gate):
    nxt = Stub()
    with pytest.raises(ConsentDenied, match="not an allowed peer"):
        g.peer_pin(gate, Request("eve", b"\x00garbage"), nxt)
    assert nxt.seen == [] and records(gate)[-1][:3] == ("eve", "(undecoded)", "deny")
    req = Request("alice", b"\x00garbage")
    assert g.peer_pin(gate, req, nxt) == b"answer" and nxt.seen == [req]  # bytes untouched: decoding comes later


def test_decode_body_refuses_malformed_bytes_and_fills_the_audit_fields(gate):
    nxt = Stub()
    with pytest.raises(WireError):
        g.decode_body(gate, Request("alice", b"\x00garbage"), nxt)
    assert nxt.seen == [] and records(gate)[-1][:3] == ("alice", "(malformed)", "deny")
    with pytest.raises(WireError):  # over the size limit
        g.decode_body(gate, Request("alice", step_bytes(batch=2**18)), nxt)
    assert nxt.seen == []
    g.decode_body(gate, Request("alice", step_bytes(seq=3, batch=5)), nxt)
    (req,) = nxt.seen
    assert req.msg.op == "step" and req.batch == 5 and req.purpose == "train"
    assert req.rec == {"session": "s1", "step": 0, "seq": 3, "batch": 5, "shapes": {"idx": [5]},
                       "purpose": "train", "anchors": {}}


def test_op_known_refuses_an_operation_the_protocol_lacks(gate):
    nxt = Stub()
    req = decoded(gate, "driver", encode(Message("drop_tables", "s1")))
    with pytest.raises(WireError, match="unknown operation 'drop_tables'; valid: step"):
        g.op_known(gate, req, nxt)
    assert nxt.seen == [] and records(gate)[-1][:3] == ("driver", "(unknown)", "deny")
    ok = decoded(gate, "driver", encode(Message("status", "s1")))
    assert g.op_known(gate, ok, nxt) == b"answer" and nxt.seen == [ok]


def test_in_order_settles_first_and_holds_the_lock_around_the_rest(gate):
    held = []

    def nxt(req):
        probe = threading.Thread(target=lambda: held.append(not gate.lock.acquire(timeout=0.01)))
        probe.start()
        probe.join()
        gate.handler.calls.append(("next",))
        return b"answer"

    assert g.in_order(gate, decoded(gate, "alice", step_bytes()), nxt) == b"answer"
    assert gate.handler.calls == [("settle",), ("next",)] and held == [True]
    assert gate.lock.acquire(timeout=0.01)  # released afterwards
    gate.lock.release()


def test_in_order_lets_a_pipelined_request_wait_for_its_predecessor(gate):
    """Request 2 arrives first: it waits (bounded) until request 1 has gone through the rest of the chain."""
    order = []

    def nxt(req):
        order.append(req.msg.seq)
        gate.guard.commit(req.caller, req.msg.session, req.msg.seq, req.data, b"ok")  # as sequence_cache does
        return b"ok"

    second = threading.Thread(target=g.in_order, args=(gate, decoded(gate, "alice", step_bytes(seq=2)), nxt))
    gate.order.finished("alice", "s1", 0, accepted=0)  # the session has a finished request: its order is tracked
    second.start()
    second.join(0.2)
    assert second.is_alive() and order == []  # waiting for request 1
    g.in_order(gate, decoded(gate, "alice", step_bytes(seq=1)), nxt)
    second.join(2.0)
    assert order == [1, 2]


def test_role_gives_data_operations_to_the_previous_party_and_control_to_the_driver(gate):
    nxt = Stub()
    for caller, data in (("driver", step_bytes()), ("alice", encode(Message("commit", "s1")))):
        with pytest.raises(ConsentDenied, match="may not call"):
            g.role(gate, decoded(gate, caller, data), nxt)
        assert records(gate)[-1][:3] == (caller, decoded(gate, caller, data).msg.op, "deny")
    assert nxt.seen == []
    for caller, data in (("alice", step_bytes()), ("driver", encode(Message("commit", "s1"))),
                         ("alice", encode(Message("open", "s1"))), ("driver", encode(Message("status", "s1")))):
        assert g.role(gate, decoded(gate, caller, data), nxt) == b"answer"
    assert len(nxt.seen) == 4


def test_sequence_cache_answers_an_exact_retry_and_refuses_replays_and_gaps(gate):
    nxt = Stub(b"answer 1")
    first = step_bytes(seq=1)
    assert g.sequence_cache(gate, decoded(gate, "alice", first), nxt) == b"answer 1" and len(nxt.seen) == 1
    assert g.sequence_cache(gate, decoded(gate, "alice", first), nxt) == b"answer 1"  # retry: from the cache
    assert len(nxt.seen) == 1 and records(gate)[-1][2:] == ("retry", "answered from cache")
    with pytest.raises(WireError, match="replayed"):  # same number, other bytes
        g.sequence_cache(gate, decoded(gate, "alice", step_bytes(seq=1, batch=8)), nxt)
    with pytest.raises(WireError, match="out-of-order"):
        g.sequence_cache(gate, decoded(gate, "alice", step_bytes(seq=3)), nxt)
    assert len(nxt.seen) == 1 and [r[2] for r in records(gate)[-2:]] == ["deny", "deny"]
    def boom(req):
        raise PartyError("refused further down")

    with pytest.raises(PartyError):  # a request that fails does not advance the counter
        g.sequence_cache(gate, decoded(gate, "alice", step_bytes(seq=2)), boom)
    assert g.sequence_cache(gate, decoded(gate, "alice", step_bytes(seq=2)), nxt) == b"answer 1"
    control = decoded(gate, "driver", encode(Message("commit", "s1", 0, 0)))
    for _ in range(2):  # control operations are not sequenced: every one reaches the next check
        g.sequence_cache(gate, control, nxt)
    assert len(nxt.seen) == 4


def test_consent_asks_the_policy_for_every_pass(gate):
    nxt = Stub()
    with pytest.raises(ConsentDenied, match="bob refused step.*max_batch = 64"):
        g.consent(gate, decoded(gate, "alice", step_bytes(batch=65)), nxt)
    assert nxt.seen == [] and records(gate)[-1][2] == "deny"
    gate.consent.policy.training = False
    with pytest.raises(ConsentDenied, match="training is not allowed"):
        g.consent(gate, decoded(gate, "alice", step_bytes()), nxt)
    gate.consent.policy.training = True
    req = decoded(gate, "alice", step_bytes())
    assert g.consent(gate, req, nxt) == b"answer" and nxt.seen == [req] and req.reason


def test_audit_records_the_outcome_and_the_answer_carries_the_head(gate):
    req = decoded(gate, "alice", step_bytes(seq=7))
    req.reason = "policy ok"
    out = decode(g.audit(gate, req, lambda r: Message("step", meta={"loss": 0.5, "_anchors": {"carol": [2, "c"]}})))
    head = gate.audit.head_ref
    assert out.meta == {"loss": 0.5, "anchors": {"carol": [2, "c"], "bob": head}} and (out.session, out.seq) == ("s1", 7)
    assert records(gate)[-1] == ("alice", "step", "allow", "policy ok")
    rec = gate.audit.db.execute("SELECT anchors FROM audit ORDER BY id DESC LIMIT 1").fetchone()[0]
    assert '"carol"' in rec  # the heads the answer brought back are anchored in this party's record
    ctl = decode(g.audit(gate, decoded(gate, "driver", encode(Message("commit", "s1"))), lambda r: Message("commit")))
    assert ctl.meta["audit_head"] == gate.audit.head_ref


def test_audit_records_a_failure_with_the_handlers_note(gate):
    gate.handler.note = "; committed step 3 (carried by this step)"

    def broken(req):
        raise RuntimeError("shape mismatch")

    with pytest.raises(PartyError, match="bob: step failed: RuntimeError: shape mismatch"):
        g.audit(gate, decoded(gate, "alice", step_bytes()), broken)
    assert records(gate)[-1] == ("alice", "step", "error",
                                 "RuntimeError: shape mismatch; committed step 3 (carried by this step)")

    def refused(req):
        raise ConsentDenied("no")

    with pytest.raises(ConsentDenied, match="^no$"):  # a ModelwardError keeps its class (its status code)
        g.audit(gate, decoded(gate, "alice", step_bytes()), refused)


def test_the_whole_gate_dispatches_only_what_every_check_admitted(gate):
    h = gate.handler
    assert decode(gate.handle("alice", step_bytes(seq=1))).meta["done"] == "step"
    assert decode(gate.handle("alice", step_bytes(seq=1))).meta["done"] == "step"  # a retry: from the cache
    for caller, data in (("eve", step_bytes(seq=2)), ("driver", step_bytes(seq=2)), ("alice", b"\x01junk"),
                         ("alice", step_bytes(seq=5)), ("alice", step_bytes(seq=2, batch=100))):
        with pytest.raises(ModelwardError):
            gate.handle(caller, data)
    assert [c for c in h.calls if c[0] == "dispatch"] == [("dispatch", "step", "alice")]
    assert h.calls.count(("settle",)) == 5  # every request past op_known settles first (eve and junk do not)
    h.fail = PartyError("not now")
    with pytest.raises(PartyError, match="not now"):
        gate.handle("driver", encode(Message("vote", "s1")))
    assert records(gate)[-1][:3] == ("driver", "vote", "error")
