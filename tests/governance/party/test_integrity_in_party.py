"""Integrity inside a party (issue 26 item 4): an in-bounds activation whose *update* is an outlier — with the
activation check switched off, so the late check is what catches it — is rolled back bit for bit, refused to
whoever would commit it, and audited; the activation check refuses it before anything is computed."""

import pytest
import torch

from modelward.core.train import TrainConfig
from modelward.governance.protocol import NumericError, StepRolledBack
from modelward.governance.wire import Message


def test_an_outlier_update_is_rolled_back_bit_identically_and_audited(make_chain):
    c = make_chain(extra={"bob": {"integrity": {"warmup_steps": 3, "max_input_ratio": 1e9}}})
    drv = c.driver(TrainConfig(steps=4, eval_every=4, batch_size=16, lr=0.05))
    drv.train()  # honest steps: bob's statistics are past their warm-up
    bob, party = c.client("bob", "alice"), c.parties["bob"]  # alice, bob's neighbour, turns hostile
    seq = bob.call(Message("open", "evil")).meta["last_seq"] + 1  # a session of her own
    before, step = c.digests()["bob"], party.step
    h = 300 * torch.randn(16, 4, 4, 4, generator=torch.Generator().manual_seed(0))  # BatchNorm hides it from the
    # loss and the parameters' update, not from its running statistics: the buffers' change is the outlier
    assert h.abs().max() < party.cfg.max_abs_input  # in bounds: the numeric check lets it through
    bob.call(Message("step", "evil", step, seq, {}, {"h": h, "idx": torch.arange(16)}))  # answered (late vote)
    with pytest.raises(StepRolledBack, match="outlier"):
        drv.call("bob", "vote", step)
    drv.call("bob", "abort", step)
    assert c.digests()["bob"] == before and party.step == step and party.prepared is None
    rows = party.audit.db.execute("SELECT decision, reason FROM audit WHERE op='step' AND reason LIKE "
                                  "'%outlier%'").fetchall()
    assert rows and all(d == "error" for d, _ in rows)
    party.integrity.monitor.cfg.max_input_ratio = 10.0  # the default: refused before anything is computed
    with pytest.raises(NumericError, match="root-mean-square"):
        bob.call(Message("step", "evil", step, seq + 1, {}, {"h": h, "idx": torch.arange(16)}))
    assert c.digests()["bob"] == before
    drv.train_step(step, torch.arange(16))  # and the honest chain goes on
