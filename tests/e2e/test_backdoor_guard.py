"""STRIP as a `guard serve` monitor over real HTTP on 127.0.0.1: a backdoored digits model behind the guard, a
client sending triggered and clean inputs. ``flag``: answered, counted per key for the operator; ``refuse``: the
triggered request is refused and nothing is charged, clean requests are answered."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from modelward.backdoor.attacks.badnets import BadNets
from modelward.backdoor.experiment import AttackSpec, BackdoorConfig, defender_split, train_backdoored
from modelward.core.data import DataConfig
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig
from modelward.extraction.guard.process import start_guard_server, write_guard_config

pytestmark = pytest.mark.slow
KEY, OPERATOR = "backdoor-test-client-key", "backdoor-test-operator-key"
NET = ModelConfig(arch="cnn", channels=[8, 16], fc=32)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.Tensor, torch.Tensor]:
    torch.set_num_threads(1)
    cfg = BackdoorConfig(data=DataConfig(source="digits"), model=NET, train=TrainConfig(steps=300, eval_every=300),
                         attack=AttackSpec(name="badnets", target=3, rate=0.1, params={"size": 2}))
    t = train_backdoored(cfg)
    (xd, _), (xe, ye) = defender_split(t.data, 0)
    d = tmp_path_factory.mktemp("guard-strip")
    np.savez(d / "clean.npz", x=xd.numpy())
    path = write_guard_config(d, t.model, NET, (1, 8, 8), 10, defense="reverse_sigmoid", defense_params={},
                              keys={KEY: 40, OPERATOR: None}, name="digits", operators={OPERATOR})
    path.write_text(path.read_text() + '\n[strip]\nenabled = true\nclean_data = "clean.npz"\nn = 20\nfrr = 0.02\n'
                    'seed = 0\n')
    triggered = BadNets(target=3, size=2).apply(xe[ye != 3][:8])
    return path, triggered, xe[:8]


def _infer(url: str, x: torch.Tensor, key: str = KEY) -> httpx.Response:
    body = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.flatten().tolist()}]}
    return httpx.post(f"{url}/v2/models/digits/infer", content=json.dumps(body).encode(),
                      headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"}, timeout=30)


def test_flag_answers_and_counts_for_the_operator(served: tuple[Path, torch.Tensor, torch.Tensor]) -> None:
    path, triggered, clean = served
    with start_guard_server(path) as server:
        assert _infer(server.url, triggered).status_code == 200  # flag: the client sees nothing different
        assert _infer(server.url, clean).status_code == 200
        status = httpx.get(f"{server.url}/v2/guard/status", headers={"Authorization": f"Bearer {OPERATOR}"},
                           timeout=10).json()
        counts = status["strip"]["keys"]["key0"]
        assert counts["rows_checked"] == 16 and counts["requests_flagged"] >= 1
        assert counts["rows_flagged"] >= 7  # the 8 triggered rows, at most a couple of the clean ones besides
        assert status["strip"]["action"] == "flag"
        assert httpx.get(f"{server.url}/v2/guard/status", headers={"Authorization": f"Bearer {KEY}"},
                         timeout=10).status_code == 403  # a client does not learn what was flagged
        assert "look triggered" in server.log_path.read_text()


def test_refuse_refuses_triggered_requests_without_charging(served: tuple[Path, torch.Tensor, torch.Tensor]
                                                             ) -> None:
    path, triggered, clean = served
    with start_guard_server(path, overrides=["strip.action=refuse"], reset=True) as server:
        for _ in range(6):  # 48 rows refused: more than the key's budget of 40, none of them charged
            r = _infer(server.url, triggered)
            assert r.status_code == 403 and "backdoor_trigger_suspected" in r.text
        answered = sum(_infer(server.url, clean[i:i + 1]).status_code == 200 for i in range(8))
        assert answered >= 6  # clean inputs are answered (STRIP's 2 % false rejections aside)
