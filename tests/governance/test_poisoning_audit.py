"""The slow poisoning in the self-audit's registry (issue 36 items 2 and 7): ``extraction_audit.ATTACKS`` holds it,
it runs after every attack that leaves Bob unchanged, and its entry attacks Bob's real state machine with the
context the audit gives, scoring the accuracy Bob lost. (The attack's figures against real party processes:
tests/e2e/test_governance_poisoning.py and tests/governance/party/test_integrity_in_party.py.)"""

from types import SimpleNamespace

import pytest
import torch

from modelward.core.train import TrainConfig
from modelward.errors import ConfigError
from modelward.governance import poisoning_audit
from modelward.governance.extraction_audit import ATTACKS, AttackSettings
from modelward.governance.neighbour_audit import Victim
from modelward.governance.plan import segment_of

TC = TrainConfig(steps=20, eval_every=20, batch_size=64, lr=0.05, momentum=0.9)


def test_the_registry_runs_slow_poisoning_last():
    names = [a.name for a in ATTACKS]
    entry = next(a for a in ATTACKS if a.name == "slow_poisoning")
    assert entry.run is poisoning_audit.run and entry.changes_bob and not entry.fresh_budget
    ordered = [a.name for a in sorted(ATTACKS, key=lambda a: a.changes_bob)]  # (run_extraction_audit's order)
    assert ordered.index("slow_poisoning") > max(ordered.index(a.name) for a in ATTACKS if not a.changes_bob)
    assert len(names) == len(set(names))


def _context(c, options):
    alice, bob = c.parties["alice"], c.parties["bob"]
    with torch.no_grad():
        alice.segment.eval()
        h_train, h_test = alice.segment(c.data.x_train), alice.segment(c.data.x_test)
    hostile = c.client("bob", "alice")  # (one key in both roles here: the oracle's data and control keys)
    fresh = lambda: segment_of(c.model, bob.cfg.layers)  # noqa: E731 (Bob's architecture, to load his states)
    victim = Victim("bob", bob.segment, fresh, 10)
    return SimpleNamespace(oracle=SimpleNamespace(data=hostile, control=hostile), victim=victim, data=c.data,
                           h_train=h_train, h_test=h_test, settings=AttackSettings(options=options), seed=0,
                           split=c.split)


def test_the_entry_attacks_bob_and_scores_what_he_lost(make_chain):
    c = make_chain(exact=False, extra={"bob": {"label_protection": {"method": "none"}}})
    with c.driver(TC) as drv:
        drv.train()
    with pytest.raises(ConfigError, match="attempt"):  # a misspelt option is named, nothing runs
        poisoning_audit.run(_context(c, {"slow_poisoning": {"attemps": 3}}))
    assert c.parties["bob"].step == 20
    [p] = poisoning_audit.run(_context(c, {"slow_poisoning": {"attempts": 4}}))
    bob = c.parties["bob"]
    assert p.attack == "slow_poisoning" and p.part == "bob" and p.chance == 0.0
    accepted = int(p.note.split(" steps accepted")[0].rsplit(" ", 1)[1])
    assert p.rows == 64 * accepted and 0.0 <= p.agreement <= 1.0 and "at the stop" in p.note
    assert p.refused == ("halted at attempt" in p.note)
    if p.refused:  # halted: rolled back to a checkpoint at or before the attack
        assert "rolled back to step" in p.note and bob.step <= 20, p
    else:  # the committed steps are Bob's
        assert bob.step == 20 + accepted, p
