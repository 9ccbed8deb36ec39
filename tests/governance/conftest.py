"""An in-process chain of parties (no sockets): the same state machine, wire bytes, checks and audit as the
servers, connected through InProcessClient."""

from pathlib import Path

import pytest

from modelward.core.data import DataConfig, load_data
from modelward.core.init import init_model_
from modelward.core.zoo import ModelConfig, build_model
from modelward.governance.demo import prepare_local_split
from modelward.governance.driver import PartyRef, SplitConfig, SplitDriver
from modelward.governance.party.config import load_party_config
from modelward.governance.party.machine import Party
from modelward.governance.transport.client import InProcessClient


class Chain:
    def __init__(self, root: Path, names, cuts, model, data, **kw):
        self.root, self.names, self.model, self.data = root, list(names), model, data
        self.split = prepare_local_split(root, model, data, self.names, cuts, **kw)
        self.parties: dict[str, Party] = {}
        for n in reversed(self.names):
            self.start(n)

    def start(self, n: str, overrides: list[str] | None = None) -> Party:
        p = Party(load_party_config(self.split.party_configs[n], overrides),
                  connect=lambda name, addr, me=n: InProcessClient(self.parties[name], caller=me))
        p.next_address = "in-process" if p.cfg.next else None
        self.parties[n] = p
        return p

    def restart(self, n: str, overrides: list[str] | None = None) -> Party:
        self.parties[n].close()
        for p in self.parties.values():  # the neighbour reconnects, as after a real restart
            if p.cfg.next == n:
                p.reconnect()
        return self.start(n, overrides)

    def client(self, party: str, caller: str) -> InProcessClient:
        return InProcessClient(self.parties[party], caller)

    def driver(self, tc, seed: int = 0, session: str | None = None, pipeline: bool | None = None,
               staleness: int = 0) -> SplitDriver:
        cfg = SplitConfig(parties=[PartyRef(name=n, address="in-process") for n in self.names], tls=self.split.tls,
                          train=tc, seed=seed, out_dir=str(self.root / "driver"))
        driver = self.split.tls.cert.rsplit("/", 1)[-1][:-4]
        return SplitDriver(cfg, session, connect=lambda ref, c: InProcessClient(self.parties[ref.name], driver),
                           pipeline=pipeline, staleness=staleness)

    def kept_steps(self, n: str) -> list[int]:
        """The steps party `n` allowed and kept, in its log's order: an ``abort S`` (the driver's recovery after a
        refused pipelined request) takes back every allowed step from S on, which is then run again."""
        kept: list[int] = []
        for op, step, decision in self.parties[n].audit.db.execute(
                "SELECT op, step, decision FROM audit WHERE op IN ('step', 'abort') ORDER BY id"):
            if op == "abort":
                kept = [s for s in kept if s < step]
            elif decision == "allow":
                kept.append(step)
        return kept

    def digests(self) -> dict[str, str]:
        return {n: p.state_digest() for n, p in self.parties.items()}

    def close(self):
        for p in self.parties.values():
            p.close()


@pytest.fixture(scope="session")
def digits():
    return load_data(DataConfig(source="digits", seed=0))


@pytest.fixture()
def make_chain(tmp_path, digits):
    made = []

    def make(names=("alice", "bob"), cuts=("conv1",), model=None, **kw):
        model = model or init_model_(build_model(ModelConfig(arch="cnn", channels=[4, 8], fc=16), (1, 8, 8), 10),
                                     seed=0)
        c = Chain(tmp_path / f"chain{len(made)}", names, list(cuts), model, digits, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()
