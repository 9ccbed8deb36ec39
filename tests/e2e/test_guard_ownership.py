"""Proof of ownership and extraction detection through a real guard server on 127.0.0.1 (issue #30): a copy made
from the guard's answers is identified by `guard verify` (local checkpoint and OIP URL), an independent model is
not, the records survive kill -9, and the PRADA detector flags and refuses a synthetic query stream without
charging it."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys

import httpx
import pytest
import torch
import torch.nn.functional as F

from modelward.core.io import save_state_dict
from modelward.core.zoo import ModelConfig, build_model
from modelward.extraction.guard.process import start_guard_server, write_guard_config
from modelward.extraction.victim import HttpVictim

K, D = 10, 12
SHAPE = (D,)
ATTACKER, PROBER, OPERATOR = "attacker-key-123", "prober-key-456", "operator-key-789"
NET = ModelConfig(arch="mlp", hidden=[64])


def _task(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(K, D, generator=torch.Generator().manual_seed(123)) * 2.0
    y = torch.randint(0, K, (n,), generator=g)
    return centers[y] + torch.randn(n, D, generator=g), y


def _fit(seed: int, x: torch.Tensor, target: torch.Tensor, epochs: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = build_model(NET, SHAPE, K)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=g)
        for i in range(0, len(x), 128):
            idx = perm[i : i + 128]
            z, t = model(x[idx]), target[idx]
            loss = F.cross_entropy(z, t) if t.dtype == torch.long else -(t * F.log_softmax(z, 1)).sum(1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.eval()


def _verify(path, suspect: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "modelward.cli.main", "guard", "verify", str(path), "--suspect",
                           suspect, *extra], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


@pytest.mark.slow
def test_a_copy_stolen_through_the_guard_is_identified_and_the_detector_refuses_a_synthetic_stream(tmp_path):
    x_own, y_own = _task(1500, seed=1)
    owner = _fit(0, x_own, y_own, epochs=15)
    own = {"watermark": {"fraction": 0.005}, "detector": {"action": "refuse", "delta": 0.93, "min_queries": 100}}
    path = write_guard_config(tmp_path / "g", owner, NET, SHAPE, K, defense="modelguard_s",
                              defense_params={"epsilon": 1.0}, keys={ATTACKER: None, PROBER: 2000, OPERATOR: None},
                              name="owner", server={"max_batch": 256}, ownership=own, operators={OPERATOR})
    x_att, _ = _task(4000, seed=7)  # the attacker's natural queries
    # the owner's key, fixed so the test is the same every run (a server makes a random one when there is none)
    (tmp_path / "g" / "guard_state").mkdir(parents=True)
    (tmp_path / "g" / "guard_state" / "watermark.key").write_bytes(b"modelward-test-watermark-key-012")
    server = start_guard_server(path)
    try:
        with HttpVictim(server.url, "owner", ATTACKER) as victim:
            answers = victim.query(x_att)
        # a JBDA-like stream: small signed steps from a few seeds
        g = torch.Generator().manual_seed(3)
        steps = [torch.randn(40, D, generator=g)]
        while sum(len(s) for s in steps) < 600:
            steps.append(steps[-1] + 0.05 * torch.sign(torch.randn(40, D, generator=g)))
        synthetic = torch.cat(steps)
        refused_at = None
        with HttpVictim(server.url, "owner", PROBER, batch_size=40) as prober:
            for i in range(0, len(synthetic), 40):
                try:
                    prober.query(synthetic[i : i + 40])
                except Exception as e:  # noqa: BLE001 - the 403 comes back as a VictimError
                    assert "extraction" in str(e) and "403" in str(e)
                    refused_at = i
                    break
        assert refused_at is not None and refused_at <= 400, "the synthetic stream was never refused"
        h = {"Authorization": f"Bearer {OPERATOR}"}
        status = httpx.get(f"{server.url}/v2/guard/status", headers=h, timeout=10).json()
        by_key = {k["key"]: k for k in status["detector"]["keys"]}
        assert by_key["key1"]["flagged"] and not by_key["key0"]["flagged"], by_key  # prober flagged, attacker not
        assert status["watermark"]["marked_rows"] >= 5
        assert httpx.get(f"{server.url}/v2/guard/status", headers={"Authorization": f"Bearer {ATTACKER}"},
                         timeout=10).status_code == 403
        server.proc.send_signal(signal.SIGKILL)  # the records must already be on disk
        server.proc.wait(timeout=10)
    finally:
        server.stop()
    db = sqlite3.connect(tmp_path / "g" / "guard_state" / "queries.sqlite")
    answered = db.execute("SELECT SUM(rows) FROM queries WHERE key_name = 'key1' AND status = 200").fetchone()[0]
    used = db.execute("SELECT used FROM usage WHERE key_name = 'key1'").fetchone()[0]
    assert answered == used == refused_at  # the refused batch was neither answered nor charged
    db.close()

    copy = _fit(5, x_att, answers, epochs=40)
    save_state_dict(tmp_path / "copy.safetensors", copy.state_dict())
    innocent = _fit(9, x_own, y_own, epochs=15)
    save_state_dict(tmp_path / "innocent.safetensors", innocent.state_dict())

    r = _verify(path, str(tmp_path / "copy.safetensors"), "--out", str(tmp_path / "verdict.json"))
    assert r.returncode == 1 and "DERIVED" in r.stdout, r.stdout + r.stderr
    r = _verify(path, str(tmp_path / "innocent.safetensors"))
    assert r.returncode == 0 and "not shown" in r.stdout, r.stdout + r.stderr

    # the copy served by someone else over the Open Inference Protocol
    path2 = write_guard_config(tmp_path / "thief", copy, NET, SHAPE, K, defense="none", keys={"thief-key-000": None},
                               name="stolen")
    with start_guard_server(path2) as thief:
        r = _verify(path, f"{thief.url}/v2/models/stolen", "--api-key", "thief-key-000")
    assert r.returncode == 1 and "DERIVED" in r.stdout, r.stdout + r.stderr
    r = _verify(path, "no/such/file.safetensors")
    assert r.returncode not in (0, 1) and "no such checkpoint" in (r.stdout + r.stderr)
