"""The party state machine in a chain (in-process): exactness, two-phase steps, numeric safety, server-side
purpose, per-peer limits, roles, bounded sessions, background checkpoints."""

import copy
import sys
import time

import pytest
import torch

from modelward.core.io import load_tensors
from modelward.core.train import TrainConfig, batch_order, train
from modelward.governance.protocol import ConsentDenied, NumericError, PartyError, StepRolledBack
from modelward.governance.wire import Message, WireError

TC = TrainConfig(steps=5, eval_every=2, batch_size=16, eval_batch_size=128, lr=0.05)


def _open(c, tc=TC):
    drv = c.driver(tc)
    drv.open(train=True)
    return drv


def test_three_party_chain_equals_monolithic_and_the_driver_sees_no_tensor(make_chain, digits):
    c = make_chain(("alice", "carol", "bob"), ("conv1", "conv2"), checkpoint_every=2)
    ref = copy.deepcopy(c.model)
    with c.driver(TC, seed=3) as drv:
        res = drv.train()
        ex = drv.checkpoint_all(export=True)
        received = {t for _, _, names in drv.received for t in names}
    mono = train(ref, digits.x_train, digits.y_train, digits.x_test, digits.y_test, TC, seed=3)
    state = {k: v for m in ex.values() for k, v in load_tensors(m["export"]).items()}
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(state[k].to(v.dtype), v, atol=1e-5, rtol=1e-5, msg=k)
    assert res.curve == mono.curve
    assert received == set()  # indices out, losses and metric sums back: never an activation or a gradient
    # every party anchored the others' heads in its own log
    for n in c.names:
        rows = c.parties[n].audit.db.execute("SELECT anchors FROM audit WHERE op='step'").fetchall()
        assert all(set(__import__("json").loads(r[0])) == set(c.names) - {n} for r in rows[1:]), n


def test_a_refusal_anywhere_leaves_every_party_bit_identical(make_chain, digits):
    c = make_chain(("alice", "carol", "bob"), ("conv1", "conv2"),
                   policies={"bob": {"allow_peers": ["alice", "carol"], "training": True, "max_batch": 16}})
    drv = _open(c)
    drv.train_step(0, torch.arange(16))  # BatchNorm statistics and momentum now exist
    before = c.digests()
    with pytest.raises(ConsentDenied, match="max_batch"):
        drv.train_step(1, torch.arange(32))  # alice and carol ran their forward (BN statistics moved) first
    assert c.digests() == before and all(p.prepared is None for p in c.parties.values())
    # a failure in the middle of the backward pass: carol's check fails after bob applied tentatively
    c.parties["carol"].cfg.max_abs_param = 1e-9
    with pytest.raises(NumericError, match="rolled back"):
        drv.train_step(1, torch.arange(16))
    assert c.digests() == before and {p.step for p in c.parties.values()} == {1}
    c.parties["carol"].cfg.max_abs_param = 1e6
    drv.train_step(1, torch.arange(16))
    assert all(c.digests()[n] != before[n] for n in c.names)
    rows = c.parties["carol"].audit.db.execute("SELECT op, purpose, decision FROM audit WHERE op='step'").fetchall()
    assert ("step", "train", "error") in rows


def test_extreme_activation_is_refused_and_an_exploding_update_rolled_back(make_chain):
    c = make_chain()
    drv = _open(c)
    bob = c.client("bob", "alice")  # alice, as bob's neighbour, sends what she likes
    bob.call(Message("open", drv.session))
    before = c.digests()["bob"]
    h = torch.full((16, 4, 4, 4), 3e38)
    h[::2] = -3e38
    with pytest.raises(NumericError, match="max_abs_input"):
        bob.call(Message("step", drv.session, 0, 1, {}, {"h": h, "idx": torch.arange(16)}))
    c.parties["bob"].cfg.max_abs_input = float("inf")  # without the bound, the post-update check catches it
    # bob answers with his input gradient first and checks his update right after (his vote comes late): the
    # step is rolled back at once, and refused to anyone who would commit it
    bob.call(Message("step", drv.session, 0, 1, {}, {"h": h, "idx": torch.arange(16)}))
    with pytest.raises(StepRolledBack, match="rolled back"):
        drv.call("bob", "vote", 0)
    with pytest.raises(StepRolledBack, match="rolled back"):
        drv.call("bob", "commit", 0)
    assert c.digests()["bob"] == before
    assert c.parties["bob"].step == 0 and c.parties["bob"].prepared is None
    rows = c.parties["bob"].audit.db.execute("SELECT op, step, decision, reason FROM audit").fetchall()
    assert any(op == "step" and d == "error" and "found by the check after" in r for op, _, d, r in rows)
    assert all(torch.isfinite(p).all() for p in c.parties["bob"].params.values())


def test_purpose_follows_from_the_operation_not_from_the_caller(make_chain):
    c = make_chain(policies={"bob": {"allow_peers": ["alice"], "training": False, "inference": True,
                                     "predict": {"result_receiver": "alice", "form": "probs"}}})
    drv = c.driver(TC)
    drv.open(train=False)
    bob = c.client("bob", "alice")
    for purpose in ("predict", "inference", "eval"):
        with pytest.raises(ConsentDenied, match="step is training"):
            bob.call(Message("step", drv.session, 0, 1, {"purpose": purpose}, {"h": torch.zeros(16, 4, 4, 4),
                                                                               "idx": torch.arange(16)}))
    assert drv.predict().shape == (360, 10)  # inference is allowed, and goes through bob's consent
    rows = set(c.parties["bob"].audit.db.execute("SELECT op, purpose, decision FROM audit").fetchall())
    assert ("step", "train", "deny") in rows and ("predict", "inference", "allow") in rows


def test_step_limits_count_per_peer_across_sessions_and_restarts(make_chain):
    c = make_chain(policies={"bob": {"allow_peers": ["alice"], "training": True, "max_steps_total": 2}})
    drv = _open(c)
    drv.train_step(0, torch.arange(16))
    drv.train_step(1, torch.arange(16))
    with pytest.raises(ConsentDenied, match="max_steps_total"):
        drv.train_step(2, torch.arange(16))
    c.restart("bob")
    for session in ("fresh-session", None):
        d2 = c.driver(TC, session=session)
        d2.open(train=True)
        with pytest.raises(ConsentDenied, match="2 training steps in total"):
            d2.train_step(2, torch.arange(16))


def test_roles_the_driver_cannot_feed_a_middle_party_nor_read_its_output(make_chain):
    c = make_chain(("alice", "carol", "bob"), ("conv1", "conv2"))
    drv = _open(c)
    carol = c.client("carol", "alice")  # alice *is* carol's prev: her eval goes on to bob; only a number returns
    r = carol.call(Message("eval", drv.session, 0, 1, {"split": "test"}, {"h": torch.zeros(8, 4, 4, 4),
                                                                           "idx": torch.arange(8)}))
    assert r.tensors == {} and set(r.meta) >= {"sum", "n"}
    with pytest.raises(ConsentDenied, match="may not call step on bob"):
        c.client("bob", "alice").call(Message("step", drv.session, 0, 1, {}, {"h": torch.zeros(8, 8, 2, 2),
                                                                             "idx": torch.arange(8)}))
    with pytest.raises(ConsentDenied, match="may not call commit"):
        c.client("bob", "carol").call(Message("commit", drv.session, 0))


def test_sessions_are_bounded_and_a_bad_sequence_number_bricks_nothing(make_chain):
    c = make_chain()
    drv = _open(c)
    alice = c.client("alice", "alice")
    alice.call(Message("open", "s", seq=2**53))  # open is not sequenced: the number is ignored
    for i in range(40):
        alice.call(Message("eval", f"s{i}", 0, 1, {"split": "test"}, {"idx": torch.arange(8)}))
    assert len(c.parties["alice"].guard.last["alice"]) <= c.parties["alice"].cfg.max_sessions_per_peer
    with pytest.raises(WireError, match="out-of-order"):
        alice.call(Message("eval", "s", 0, 2**53, {"split": "test"}, {"idx": torch.arange(8)}))
    alice.call(Message("eval", "s", 0, 1, {"split": "test"}, {"idx": torch.arange(8)}))
    with pytest.raises(WireError, match="replayed"):  # an evicted session comes back from the audit log
        alice.call(Message("eval", "s0", 0, 1, {"split": "test"}, {"idx": torch.arange(7)}))
    drv.train_step(0, torch.arange(16))


def test_background_checkpoint_holds_the_state_of_its_step(make_chain, digits):
    c = make_chain(checkpoint_every=2)
    drv = _open(c)
    it = batch_order(len(digits.x_train), 16, 0)
    drv.train_step(0, next(it))
    drv.train_step(1, next(it))  # step 2 reached: checkpoint written in the background
    at2 = {n: {k: v.clone() for k, v in p.segment.state_dict().items()} for n, p in c.parties.items()}
    drv.train_step(2, next(it))
    for n, p in c.parties.items():
        assert p.checkpoints() == [0, 2]
        saved = load_tensors(p.ckpt.path(2))
        for k, v in at2[n].items():
            assert torch.equal(saved[f"model.{k}"], v), k


def test_a_failed_background_write_is_reported_before_the_next_step_computes(make_chain):
    c = make_chain()
    drv = _open(c)
    c.parties["bob"].ckpt._error = "checkpoint step_00000002.safetensors could not be written: OSError: disk full"
    before = c.digests()
    with pytest.raises(PartyError, match="disk full"):
        drv.train_step(0, torch.arange(16))
    assert c.digests() == before
    drv.train_step(0, torch.arange(16))
    assert {p.step for p in c.parties.values()} == {1}


def test_private_init_differs_per_start_and_test_seed_is_refused_off_loopback(make_chain, tmp_path):
    from modelward.errors import ConfigError
    from modelward.governance.party.config import check_test_only, load_party_config

    a = make_chain(own_init=False)
    b = make_chain(own_init=False)
    wa, wb = (next(iter(ch.parties["bob"].params.values())) for ch in (a, b))
    assert not torch.equal(wa, wb)  # OS CSPRNG: two starts of the same config differ
    cfg = load_party_config(a.split.party_configs["bob"], ["init.test_seed=0", "host=10.0.0.5"])
    with pytest.raises(ConfigError, match="test-only"):
        check_test_only(cfg)
    check_test_only(load_party_config(a.split.party_configs["bob"], ["init.test_seed=0"]))


def test_port_in_use_is_a_config_error_not_a_traceback(make_chain):
    import socket

    from modelward.errors import ConfigError
    from modelward.governance.transport.server import PartyServer

    c = make_chain()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        c.parties["alice"].cfg.port = s.getsockname()[1]
        with pytest.raises(ConfigError, match="in use"):
            PartyServer(c.parties["alice"])


def test_a_lazy_commit_travels_with_the_next_step_and_survives_a_refusal(make_chain):
    c = make_chain(("alice", "carol", "bob"), ("conv1", "conv2"),
                   policies={"bob": {"allow_peers": ["alice", "carol"], "training": True, "max_batch": 16}})
    drv = _open(c)
    drv.train_step(0, torch.arange(16), lazy=True)
    assert {(p.step, p.prepared.step) for p in c.parties.values()} == {(0, 0)}
    drv.train_step(1, torch.arange(16), lazy=True)  # carries the commit of step 0 along the chain
    assert {(p.step, p.prepared.step) for p in c.parties.values()} == {(1, 1)}
    after = c.digests()
    with pytest.raises(ConsentDenied, match="max_batch"):
        drv.train_step(2, torch.arange(32), lazy=True)  # bob refuses before his commit of step 1 arrives
    assert {(p.step, p.prepared) for p in c.parties.values()} == {(2, None)} and c.digests() == after


def test_label_protection_hook_perturbs_only_the_returned_gradient(make_chain):
    plain = make_chain()
    protected = make_chain(extra={"bob": {"label_protection": {"method": "marvell", "scale": 4.0}}})
    for c in (plain, protected):
        _open(c).train_step(0, torch.arange(16))
    assert plain.digests()["bob"] == protected.digests()["bob"]  # bob's loss and his own update are his business
    assert plain.digests()["alice"] != protected.digests()["alice"]  # alice learned from a perturbed gradient
    from modelward.errors import ConfigError
    from modelward.governance.party.config import load_party_config
    from modelward.governance.party.machine import Party

    with pytest.raises(ConfigError, match="label_protection"):
        Party(load_party_config(protected.split.party_configs["bob"], ["label_protection.method=bogus"]))


def test_a_non_peer_is_refused_before_its_message_is_decoded(make_chain):
    c = make_chain()
    bob = c.parties["bob"]
    with pytest.raises(ConsentDenied, match="not an allowed peer"):
        bob.handle("mallory", b"\x00" * 1000)  # not even a wire message: never parsed
    with pytest.raises(WireError, match="bad magic"):
        bob.handle("alice", b"\x00" * 1000)
    rows = bob.audit.db.execute("SELECT caller, op, decision FROM audit").fetchall()
    assert ("mallory", "(undecoded)", "deny") in rows and ("alice", "(malformed)", "deny") in rows


@pytest.mark.parametrize("late", ["alice", "carol", "bob"])
def test_a_check_that_fails_after_the_answer_rolls_the_step_back_on_every_party(make_chain, late):
    """Every party answers before its own update is checked (its vote is late), so the driver already has the
    step's loss when the check fails. The step must still be rolled back on every party, and the parties that
    hold its commit must not apply it (the first party as well as the middle and the last one)."""
    c = make_chain(("alice", "carol", "bob"), ("conv1", "conv2"), checkpoint_every=1)
    drv = _open(c)
    drv.train_step(0, torch.arange(16), lazy=True)
    drv.train_step(1, torch.arange(16), lazy=True)
    drv.flush()
    before = c.digests()  # step 1 committed everywhere
    c.parties[late].cfg.max_abs_param = 1e-9
    drv.train_step(2, torch.arange(16), lazy=True)  # answered: the late check has not spoken yet
    assert drv.uncommitted == 2
    with pytest.raises(StepRolledBack, match=f"party {late}: the update of step 2 .* rolled back"):
        drv.train_step(3, torch.arange(16), lazy=True)  # carries the commit of step 2: refused, aborted
    assert c.digests() == before
    assert {(p.step, p.prepared) for p in c.parties.values()} == {(2, None)}
    assert {max(p.checkpoints()) for p in c.parties.values()} == {2}  # no checkpoint of the refused step
    rows = c.parties[late].audit.db.execute("SELECT step, decision, reason FROM audit WHERE op='step'").fetchall()
    assert any(s == 2 and d == "error" and "found by the check after" in r for s, d, r in rows)
    # the step runs again once the cause is gone, and the next commit goes through
    c.parties[late].cfg.max_abs_param = 1e6
    drv.train_step(2, torch.arange(16), lazy=True)
    drv.train_step(3, torch.arange(16))
    assert {(p.step, p.prepared) for p in c.parties.values()} == {(4, None)}


def test_commits_held_during_the_next_step_checkpoint_the_committed_state(make_chain, digits):
    """The first and middle parties commit step s only once the parties after them have (while step s+1 runs
    its forward pass, which moves the BatchNorm statistics): the checkpoint of step s+1 must still hold the
    state right after step s, exactly as without carried commits."""
    lazy, eager = make_chain(("alice", "carol", "bob"), ("conv1", "conv2"), checkpoint_every=2), \
        make_chain(("alice", "carol", "bob"), ("conv1", "conv2"), checkpoint_every=2)
    order = list(batch_order(len(digits.x_train), 16, 0).__next__() for _ in range(5))
    for chain, is_lazy in ((lazy, True), (eager, False)):
        drv = _open(chain)
        for s, idx in enumerate(order):
            drv.train_step(s, idx, lazy=is_lazy)
        drv.flush()
    for n in lazy.names:
        assert lazy.parties[n].checkpoints() == eager.parties[n].checkpoints() == [0, 2, 4]
        for step in (2, 4):
            a, b = load_tensors(lazy.parties[n].ckpt.path(step)), load_tensors(eager.parties[n].ckpt.path(step))
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), (n, step)
    assert lazy.digests() == eager.digests()


@pytest.mark.parametrize("late", ["alice", "carol", "bob"])
def test_an_evaluation_carries_the_last_commit_along_the_chain(make_chain, late):
    """The evaluation after a lazy step carries its commit (no vote and commit rounds): it scores the state every
    party voted for and leaves every party committed; when a party's late check failed, the evaluation is refused
    and the step rolled back everywhere, as when the next step carries the commit."""
    ok, bad = (make_chain(("alice", "carol", "bob"), ("conv1", "conv2"), checkpoint_every=1) for _ in range(2))
    drivers = {}
    for c in (ok, bad):
        drv = drivers[id(c)] = _open(c)
        drv.train_step(0, torch.arange(16), lazy=True)
        drv.train_step(1, torch.arange(16), lazy=True)

    drv, prepared = drivers[id(ok)], ok.digests()
    err = drv.evaluate()
    assert drv.uncommitted is None
    assert {(p.step, p.prepared) for p in ok.parties.values()} == {(2, None)}
    assert {max(p.checkpoints()) for p in ok.parties.values()} == {2}
    assert ok.digests() == prepared  # the state scored is the one committed
    drv.flush()  # nothing left to commit
    assert drv.evaluate() == err
    for n in ("alice", "carol"):  # the first and middle parties commit once the parties after them answered
        rows = ok.parties[n].audit.db.execute("SELECT reason FROM audit WHERE op='eval'").fetchall()
        assert any("committed step 1 (carried by this eval)" in r for (r,) in rows), n

    drv = drivers[id(bad)]
    drv.flush()
    before = bad.digests()
    bad.parties[late].cfg.max_abs_param = 1e-9
    drv.train_step(2, torch.arange(16), lazy=True)  # answered: the late check has not spoken yet
    with pytest.raises(StepRolledBack, match=f"party {late}: the update of step 2 .* rolled back"):
        drv.evaluate()
    assert bad.digests() == before and drv.uncommitted is None
    assert {(p.step, p.prepared) for p in bad.parties.values()} == {(2, None)}
    assert {max(p.checkpoints()) for p in bad.parties.values()} == {2}
    bad.parties[late].cfg.max_abs_param = 1e6
    drv.train_step(2, torch.arange(16), lazy=True)
    drv.evaluate()
    assert {(p.step, p.prepared) for p in bad.parties.values()} == {(3, None)}


def test_the_first_party_updates_before_it_answers_and_the_others_after(make_chain):
    """The first party's caller waits for the loss only, so it runs its backward pass and update before it
    answers, on the request's own thread (no hand-over to the update thread: nothing would overlap it). Every
    later party answers with its input gradient first and updates on its update thread. Either way the check
    stays a late vote (covered above) and the result is the monolithic one (the e2e equivalence tests)."""
    import threading

    c = make_chain(("alice", "carol", "bob"), ("conv1", "conv2"))
    drv = _open(c)
    threads: dict[str, str] = {}
    for n, p in c.parties.items():
        def late(*args, _n=n, _f=p.tentative.late_update):
            threads[_n] = threading.current_thread().name
            return _f(*args)
        p.tentative.late_update = late
    drv.train_step(0, torch.arange(16))
    assert threads["alice"] == threading.current_thread().name
    assert threads["carol"].startswith("update-carol") and threads["bob"].startswith("update-bob")
    assert {(p.step, p.prepared) for p in c.parties.values()} == {(1, None)}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_IDLE is Linux's")
def test_the_late_update_runs_at_idle_priority_and_falls_back_when_starved(make_chain):
    """A party's late update (after its answer) runs at SCHED_IDLE by default, at normal priority with
    update_priority = "normal". One that took far longer than the CPU it used was starved: the party says so in
    its status and runs the next ones at normal priority (the same state either way)."""
    import os

    idle, normal = make_chain(), make_chain(extra={"bob": {"update_priority": "normal"}})
    policies: dict[str, list[int]] = {"idle": [], "normal": []}
    for key, c in (("idle", idle), ("normal", normal)):
        bob = c.parties["bob"]

        def late(*args, _f=bob.tentative.late_update, _key=key):
            policies[_key].append(os.sched_getscheduler(0))
            return _f(*args)

        bob.tentative.late_update = late
        drv = _open(c)
        drv.train_step(0, torch.arange(16))
    assert policies == {"idle": [os.SCHED_IDLE], "normal": [os.SCHED_OTHER]}
    assert idle.digests() == normal.digests()

    bob = idle.parties["bob"]
    update = bob.tentative.update

    def starved(*args):  # waits instead of computing, as a thread no CPU is given to would
        time.sleep(0.15)
        return update(*args)

    bob.tentative.update = starved
    bob.tentative.update_priority = "idle"  # a loaded host may have starved step 0 for real already (0.88 s of
    # wall for 8 ms of CPU under two test workers): the forced case starts from idle again
    drv = _open(idle)
    drv.train_step(1, torch.arange(16))
    assert bob._status()["update_priority"].startswith("normal (the late part of step 1 took")
    bob.tentative.update = update
    drv.train_step(2, torch.arange(16))
    assert policies["idle"][-1] == os.SCHED_OTHER


def _overtaking(party, delay: float = 0.03):
    """Deliver every even-numbered step to `party` late, so that the odd step sent after it arrives first."""
    from modelward.governance.wire import decode

    handle = party.handle

    def late_even(caller, data):
        msg = decode(data, allow_nonfinite=True)
        if msg.op == "step" and msg.step % 2 == 0:
            time.sleep(delay)
        return handle(caller, data)

    party.handle = late_even


def test_a_pipelined_driver_trains_exactly_like_a_sequential_one_when_steps_overtake(make_chain):
    """The driver sends step s+1 (carrying the commit of step s) before step s is answered. Even when s+1 reaches
    the first party before s, the party runs them in order: same states, curve and audit as one step at a time,
    and no request refused."""
    tc = TrainConfig(steps=8, eval_every=4, batch_size=16, eval_batch_size=128, lr=0.05)
    seq, pipe = (make_chain(("alice", "carol", "bob"), ("conv1", "conv2"), checkpoint_every=3) for _ in range(2))
    _overtaking(pipe.parties["alice"])
    with seq.driver(tc, seed=2, pipeline=False) as a, pipe.driver(tc, seed=2, pipeline=True) as b:
        ra, rb = a.train(), b.train()
    assert rb.curve == ra.curve and pipe.digests() == seq.digests()
    assert {(p.step, p.prepared) for p in pipe.parties.values()} == {(8, None)}
    for n in pipe.names:
        assert pipe.parties[n].checkpoints() == seq.parties[n].checkpoints()
        assert pipe.kept_steps(n) == seq.kept_steps(n) == list(range(tc.steps)), n
        # no request refused, but for the driver's designed recovery on a host that stalls a sender thread past
        # InOrder's 2 s (refused unread as out of order, aborted, sent again; tests/governance/driver/
        # test_staleness.py forces it): the states and curve above are equal either way
        rows = pipe.parties[n].audit.db.execute(
            "SELECT step, decision, reason FROM audit WHERE op='step' AND decision != 'allow'").fetchall()
        assert all(d in ("deny", "error") and "out-of-order" in r for _, d, r in rows), (n, rows)



def test_a_step_that_overtook_an_absent_predecessor_is_sent_again_and_the_run_stays_exact(make_chain):
    """A loaded host: each even step reaches the first party long after the odd step sent behind it (0.3 s, far
    beyond the party's InOrder bound, shortened here to 0.05 s), so the odd step is taken first and refused, unread,
    as out of order. The driver settles the step before, sends the refused one again from the same batch, and the
    run ends in exactly the state, curve and checkpoints of a sequential driver (no WireError escapes)."""
    tc = TrainConfig(steps=6, eval_every=3, batch_size=16, eval_batch_size=128, lr=0.05)
    seq, pipe = (make_chain(checkpoint_every=2) for _ in range(2))
    pipe.parties["alice"].gate.order.wait_s = 0.05
    _overtaking(pipe.parties["alice"], delay=0.3)
    with seq.driver(tc, seed=2, pipeline=False) as a, pipe.driver(tc, seed=2, pipeline=True) as b:
        ra, rb = a.train(), b.train()
    assert rb.curve == ra.curve and pipe.digests() == seq.digests()
    assert {(p.step, p.prepared) for p in pipe.parties.values()} == {(6, None)}
    for n in pipe.names:
        assert pipe.parties[n].checkpoints() == seq.parties[n].checkpoints()
    refused = pipe.parties["alice"].audit.db.execute(
        "SELECT step, reason FROM audit WHERE op='step' AND decision='deny'").fetchall()
    assert refused and all("out-of-order" in r for _, r in refused)  # the interleaving did happen
    allowed = pipe.parties["bob"].audit.db.execute(
        "SELECT step FROM audit WHERE op='step' AND decision='allow'").fetchall()
    assert sorted(s for (s,) in allowed) == list(range(6))  # every step ran once at bob


def test_a_refusal_with_a_step_in_flight_behind_it_aborts_both(make_chain):
    """Bob refuses step 3 while step 4 is already on its way to Alice: step 4 is refused too (out of order, in
    Alice's log), both are aborted, step 2 is committed everywhere, and the state is the one a sequential driver
    leaves after the same refusal."""
    tc = TrainConfig(steps=8, eval_every=8, batch_size=16, eval_batch_size=128, lr=0.05)
    pol = {"bob": {"allow_peers": ["alice"], "training": True, "max_steps_per_session": 3}}
    seq, pipe = (make_chain(policies=pol, checkpoint_every=100) for _ in range(2))
    for c, pipelined in ((seq, False), (pipe, True)):
        with c.driver(tc, seed=1, pipeline=pipelined) as drv:
            with pytest.raises(ConsentDenied, match="max_steps_per_session"):
                drv.train()
        assert {(p.step, p.prepared) for p in c.parties.values()} == {(3, None)}
    assert pipe.digests() == seq.digests()
    denied = pipe.parties["alice"].audit.db.execute(
        "SELECT step, reason FROM audit WHERE op='step' AND decision='deny'").fetchall()
    assert [s for s, _ in denied] == [4] and "out-of-order" in denied[0][1]


def test_a_step_numbered_after_its_predecessor_failed_does_not_take_the_failed_number(make_chain):
    """The interleaving of the test above that a loaded host produces: bob refuses step 3 (sent ahead, on a sender
    thread) before the driver numbers step 4. The failed request must not give its number back while step 4 is
    being sent: step 4 would be accepted under it, run against a party that never prepared step 3, and fail with
    a different error. It is refused out of order instead, and the state is the sequential driver's."""
    import threading

    tc = TrainConfig(steps=8, eval_every=8, batch_size=16, eval_batch_size=128, lr=0.05)
    pol = {"bob": {"allow_peers": ["alice"], "training": True, "max_steps_per_session": 3}}
    seq, pipe = (make_chain(policies=pol, checkpoint_every=100) for _ in range(2))
    with seq.driver(tc, seed=1, pipeline=False) as drv:
        with pytest.raises(ConsentDenied):
            drv.train()
    alice, refused = pipe.parties["alice"], threading.Event()
    handle = alice.handle

    def noting_the_refusal(caller, data):
        try:
            return handle(caller, data)
        except ConsentDenied:
            refused.set()
            raise

    alice.handle = noting_the_refusal
    with pipe.driver(tc, seed=1, pipeline=True) as drv:
        send = drv._send_step

        def after_the_refusal(step, *args, **kw):
            if step == 4:
                assert refused.wait(10.0)  # step 3's call has failed (and returned) before step 4 is numbered
                time.sleep(0.05)
            return send(step, *args, **kw)

        drv._send_step = after_the_refusal
        with pytest.raises(ConsentDenied, match="max_steps_per_session"):
            drv.train()
    assert {(p.step, p.prepared) for p in pipe.parties.values()} == {(3, None)}
    assert pipe.digests() == seq.digests()
    rows = alice.audit.db.execute("SELECT step, decision, reason FROM audit WHERE op='step' AND step=4").fetchall()
    assert [(s, d) for s, d, _ in rows] == [(4, "deny")] and "out-of-order" in rows[0][2]


def test_a_shutdown_while_the_late_update_runs_waits_for_it_before_rolling_back(make_chain):
    """SIGTERM right after a party answered: its weight pass and update are still running on the update thread.
    The clean stop rolls the uncommitted step back and checkpoints the party; the update must not run after (or
    during) that rollback, which would leave a half-applied step in memory or in the checkpoint. The update is
    held back until the rollback starts (at most 1 s): the stop must wait for it instead."""
    import threading

    from modelward.governance.transport.server import _shut_down

    c = make_chain()
    drv = _open(c)
    drv.train_step(0, torch.arange(16))  # committed: bob is at step 1, no checkpoint of it yet
    bob = c.parties["bob"]
    before = {k: v.clone() for k, v in bob._state_tensors()[0].items()}
    rolling_back, order = threading.Event(), []
    late, rollback = bob.tentative.late_update, bob.tentative.rollback

    def late_update(*args):
        rolling_back.wait(1.0)
        late(*args)
        order.append("update")

    def rollback_(*args):
        rolling_back.set()
        order.append("rollback")
        rollback(*args)

    bob.tentative.late_update, bob.tentative.rollback = late_update, rollback_
    drv.train_step(1, torch.arange(16), lazy=True)  # answered; bob's update is still to come
    _shut_down(bob)
    assert order == ["update", "rollback"]
    saved = load_tensors(bob.ckpt.path(1))
    assert saved.keys() == before.keys()
    assert all(torch.equal(saved[k], v) for k, v in before.items())


def test_the_heads_published_after_training_are_on_stable_storage(make_chain, monkeypatch):
    """Data passes are synced to disk in the background; the heads a run publishes (summary.json) must not rest on
    records a power cut could still take away, or the log would later look truncated against them."""
    from modelward.governance.audit import AuditLog

    fsync = AuditLog._fsync_wal

    def slow_fsync(self):
        time.sleep(0.05)
        fsync(self)

    c = make_chain()
    monkeypatch.setattr(AuditLog, "_fsync_wal", slow_fsync)
    res = _open(c, TrainConfig(steps=3, eval_every=3, batch_size=16, eval_batch_size=128)).train()
    for n, p in c.parties.items():
        assert p.audit._synced >= res.audit_heads[n][0], n
        assert res.audit_heads[n] == p.audit.head_ref, n


def test_the_session_opens_on_all_parties_at_once_and_reports_the_first_error_in_chain_order(make_chain):
    """The open round goes to every party at once (one round trip across hosts, not one per party); when parties
    fail, the error raised is the first one in chain order, after every answer is in."""
    import threading

    from modelward.governance.driver import PartyRef, SplitConfig, SplitDriver
    from modelward.governance.protocol import PartyUnavailable
    from modelward.governance.transport.client import InProcessClient

    c = make_chain(names=("alice", "bob", "carol"), cuts=("conv1", "conv2"))
    inside = threading.Barrier(3, timeout=10)  # every open must be in flight before any of them is answered
    down: set[str] = set()

    class Client(InProcessClient):
        def call(self, msg, timeout=None):
            if msg.op == "open":
                inside.wait()
                if self.party.cfg.name in down:
                    raise PartyUnavailable(f"{self.party.cfg.name} is down")
            return super().call(msg, timeout)

    cfg = SplitConfig(parties=[PartyRef(name=n, address="in-process") for n in c.names], tls=c.split.tls,
                      train=TC, seed=0, out_dir=str(c.root / "driver"))
    with SplitDriver(cfg, connect=lambda ref, _: Client(c.parties[ref.name], "alice")) as drv:
        assert set(drv.open(train=True)) == {"alice", "bob", "carol"}  # (a sequential round would never pass)
        down.update({"bob", "carol"})
        inside.reset()
        with pytest.raises(PartyUnavailable, match="bob is down"):
            drv.open(train=True)


def test_a_thread_count_set_from_a_side_thread_leaves_the_modes_bit_identical(make_chain):
    """``torch.set_num_threads`` called from another thread (a library, a server thread, an earlier test) changes
    the count that threads started later take, not this thread's. A party's and the driver's worker threads take
    the count of the thread that built them, so the pipelined run (its passes on the driver's sender threads) still
    equals the sequential one (its passes on this thread) bit for bit. (Without that, two CI runs on two pytest
    workers ended with other digests.)"""
    import threading

    main = torch.get_num_threads()
    other = 1 if main > 1 else 2
    tc = TrainConfig(steps=6, eval_every=6, batch_size=16, eval_batch_size=128, lr=0.05)
    seq, pipe = (make_chain(("alice", "carol", "bob"), ("conv1", "conv2")) for _ in range(2))
    side = threading.Thread(target=torch.set_num_threads, args=(other,))
    side.start()
    side.join()
    try:
        with seq.driver(tc, seed=2, pipeline=False) as a, pipe.driver(tc, seed=2, pipeline=True) as b:
            ra, rb = a.train(), b.train()
    finally:
        torch.set_num_threads(main)
    assert torch.get_num_threads() == main
    assert rb.curve == ra.curve and pipe.digests() == seq.digests()
