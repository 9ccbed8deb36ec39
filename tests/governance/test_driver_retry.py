"""The driver retries an evaluation (and the session's reopening) with backoff when a party is briefly
unavailable, as it does for steps: a party killed during an evaluation and restarted from its older checkpoint
still gives a run equal to monolithic training, with every evaluation point in the curve exactly once."""

import copy
import time

import pytest
import torch

from modelward.core.io import load_tensors
from modelward.core.train import TrainConfig, train
from modelward.governance.driver import PartyRef, SplitConfig, SplitDriver
from modelward.governance.protocol import PartyUnavailable
from modelward.governance.transport.client import InProcessClient

TC = TrainConfig(steps=6, eval_every=2, batch_size=16, eval_batch_size=128, lr=0.05)


class Flaky(InProcessClient):
    """Reaches the chain's *current* party of that name (a restart replaces it); unavailable while `down`."""

    def __init__(self, chain, name: str, caller: str, down: dict[str, float], on_call) -> None:
        super().__init__(chain.parties[name], caller)
        self.chain, self.pname, self.down, self.on_call = chain, name, down, on_call

    def call(self, msg, timeout=None):
        self.on_call(self.pname, msg)
        if time.monotonic() < self.down.get(self.pname, 0.0):
            raise PartyUnavailable(f"party {self.pname} at in-process:{self.pname} is not reachable")
        self.party = self.chain.parties[self.pname]
        return super().call(msg, timeout)


def _driver(c, down, on_call, retry_s=20.0):
    cfg = SplitConfig(parties=[PartyRef(name=n, address="in-process") for n in c.names], tls=c.split.tls,
                      train=TC, seed=1, out_dir=str(c.root / "driver"), retry_s=retry_s)
    me = c.split.tls.cert.rsplit("/", 1)[-1][:-4]
    return SplitDriver(cfg, connect=lambda ref, _: Flaky(c, ref.name, me, down, on_call))


@pytest.mark.parametrize("restart", [False, True], ids=["transient", "killed-and-restarted"])
def test_a_party_lost_during_an_evaluation_is_waited_for_and_the_run_equals_monolithic(make_chain, digits, restart):
    c = make_chain(checkpoint_every=3)
    ref = copy.deepcopy(c.model)
    down: dict[str, float] = {}
    evals: list[int] = []

    def on_call(name, msg):
        if name == "alice" and msg.op == "eval":
            evals.append(msg.seq)
            if len(evals) == 3 and not down:  # the evaluation at step 4 (after those at 0 and 2)
                if restart:  # bob dies and comes back from his checkpoint at step 3 (the others are at 4)
                    c.restart("bob")
                down["alice"] = time.monotonic() + 0.6  # and alice's link is down for a while: several retries

    with _driver(c, down, on_call) as drv:
        res = drv.train()
        ex = drv.checkpoint_all(export=True)
    assert down and res.resumes >= 1 and res.steps_run == TC.steps
    mono = train(ref, digits.x_train, digits.y_train, digits.x_test, digits.y_test, TC, seed=1)
    assert res.curve == mono.curve  # every evaluation point once, each scoring the state monolithic training had
    assert [s for s, _ in res.curve] == [0, 2, 4, 6]
    state = {k: v for m in ex.values() for k, v in load_tensors(m["export"]).items()}
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(state[k].to(v.dtype), v, atol=1e-5, rtol=1e-5, msg=k)


def test_a_party_that_stays_unreachable_is_named_with_its_address_after_retry_s(make_chain):
    c = make_chain()
    down: dict[str, float] = {}

    def on_call(name, msg):
        if name == "alice" and msg.op == "eval" and msg.seq > 1:
            down["alice"] = float("inf")  # alice never comes back (during the second evaluation)

    with _driver(c, down, on_call, retry_s=1.0) as drv:
        t0 = time.monotonic()
        with pytest.raises(PartyUnavailable, match=r"party alice at in-process:alice .*after retrying for \d+ s"):
            drv.train()
        assert time.monotonic() - t0 < 10


def test_a_party_lost_before_the_final_checkpoint_is_waited_for_and_retrained(make_chain, digits):
    """The checkpoint round after training (what `split train` does last) meets a party that restarted from an
    older checkpoint: the driver waits, retrains the steps since the common checkpoint, checkpoints, and the
    result still equals monolithic training."""
    c = make_chain(checkpoint_every=4)
    ref = copy.deepcopy(c.model)
    down: dict[str, float] = {}

    def on_call(name, msg):
        if name == "alice" and msg.op == "checkpoint" and not down:
            c.restart("bob")  # bob comes back from his checkpoint at step 4 (the others are at 6)
            down["alice"] = time.monotonic() + 0.5

    with _driver(c, down, on_call) as drv:
        res, _ = drv.train_to_checkpoint(out_dir=c.root / "driver")
        ex = drv.checkpoint_all(export=True)
    assert down and res.resumes >= 1 and res.steps_run == TC.steps
    # the parties were restored to bob's checkpoint and steps 4 and 5 were trained again
    assert c.parties["alice"].audit.db.execute("SELECT count(*) FROM audit WHERE op='restore'").fetchone()[0] >= 1
    mono = train(ref, digits.x_train, digits.y_train, digits.x_test, digits.y_test, TC, seed=1)
    assert res.curve == mono.curve
    state = {k: v for m in ex.values() for k, v in load_tensors(m["export"]).items()}
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(state[k].to(v.dtype), v, atol=1e-5, rtol=1e-5, msg=k)
