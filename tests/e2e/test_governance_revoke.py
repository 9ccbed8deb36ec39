"""Revocation across real servers (issue #27): two party processes over gRPC + mutual TLS; Bob's organisation runs
`party revoke alice` while a session trains, and Bob refuses Alice's next step (PERMISSION_DENIED, ConsentDenied
at the driver), records the refusal, and the refused step is applied on neither party."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelward.core.data import DataConfig, load_data
from modelward.core.init import init_model_
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig, build_model
from modelward.governance.audit import AuditLog
from modelward.governance.demo import prepare_local_split
from modelward.governance.driver import SplitDriver
from modelward.governance.party.config import load_party_config, revoke_peer
from modelward.governance.protocol import ConsentDenied


@pytest.mark.slow
def test_a_party_revoked_while_serving_is_refused_at_its_next_step(tmp_path: Path) -> None:
    data = load_data(DataConfig(source="digits", seed=0))
    model = init_model_(build_model(ModelConfig(arch="cnn", channels=[4, 8], fc=16), (1, 8, 8), 10), seed=0)
    split = prepare_local_split(tmp_path, model, data, ["alice", "bob"], ["conv1"], threads=1, driver="operator")
    split.start()
    try:
        tc = TrainConfig(steps=6, eval_every=6, batch_size=16, eval_batch_size=512, lr=0.05)
        done: list[int] = []

        def on_step(step, loss, links):
            done.append(step)
            if step == 2:
                revoke_peer(load_party_config(split.party_configs["bob"]), "alice")

        with SplitDriver(split.split_config(tc, 0, retry_s=0.0), pipeline=False) as drv:
            with pytest.raises(ConsentDenied, match="'alice' is refused: certificate sha256:[0-9a-f]+ is revoked"):
                drv.train(on_step=on_step)
            assert done == [1, 2]
            steps = {n: int(drv.call(n, "status").meta["step"]) for n in drv.names}  # the driver is not revoked
        assert steps == {"alice": 2, "bob": 2}
    finally:
        split.stop()
    log = AuditLog(load_party_config(split.party_configs["bob"]).audit_db, "bob")
    try:
        rows = log.db.execute("SELECT caller, decision FROM audit WHERE op = '(revoked)'").fetchall()
    finally:
        log.close()
    assert rows == [("alice", "deny")]
