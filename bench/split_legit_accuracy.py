"""What the legitimate user of a split keeps and loses under the shipped defaults (issue 36): the test accuracy of
the trained model (the exported parts, scored monolithically) and the accuracy the driver is told (the label
holder's noisy evaluation answer), over several seeds of the demo's split (examples/split_digits.toml: the digits
CNN, 200 steps of 64, an evaluation every 20 steps).

    python bench/split_legit_accuracy.py [--seeds 8] [--steps 200]

Each seed starts both parties from one Glorot initialisation (seed s; the data order seed s) and runs the parties in
this process (the same state machine, wire bytes, checks and audit as ``party serve``; no sockets), Bob under the
shipped policy (examples/policy_bob.toml) and PARTY.toml defaults, except that his Marvell noise takes the seed s
(``label_protection.seed``): a run is then a function of its seed, and the same script run on two versions of
modelward shows whether a change moved the training itself (the digests of the final state). Prints per seed:
the true accuracy, the reported one, the digest; then the means.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import tomllib
from pathlib import Path

import torch

from modelward.core.data import DataConfig, load_data
from modelward.core.init import init_model_
from modelward.core.io import load_tensors
from modelward.core.train import TrainConfig, evaluate
from modelward.core.zoo import ModelConfig, build_model
from modelward.governance.demo import prepare_local_split
from modelward.governance.driver import PartyRef, SplitConfig, SplitDriver
from modelward.governance.party.config import load_party_config
from modelward.governance.party.machine import Party
from modelward.governance.transport.client import InProcessClient

EX = Path(__file__).resolve().parents[1] / "examples"


def run(seed: int, steps: int, root: Path, data) -> tuple[float, float, str]:
    model = init_model_(build_model(ModelConfig(arch="cnn", channels=[16, 32], fc=64), (1, 8, 8), 10),
                        "glorot_uniform", seed)
    policy = tomllib.loads((EX / "policy_bob.toml").read_text())
    split = prepare_local_split(root, model, data, ["alice", "bob"], ["conv1"], threads=1, exact=False,
                                driver="operator", policies={"bob": policy, "alice": {
                                    "allow_peers": ["operator"], "training": True}},
                                extra={"bob": {"label_protection": {"method": "marvell", "scale": 4.0,
                                                                    "seed": seed}}})
    parties: dict[str, Party] = {}
    for n in ("bob", "alice"):
        p = Party(load_party_config(split.party_configs[n]),
                  connect=lambda name, addr, me=n: InProcessClient(parties[name], caller=me))
        p.next_address = "in-process" if p.cfg.next else None
        parties[n] = p
    tc = TrainConfig(optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=1e-4, batch_size=64, steps=steps,
                     eval_every=20, loss="error")
    cfg = SplitConfig(parties=[PartyRef(name=n, address="in-process") for n in ("alice", "bob")], tls=split.tls,
                      train=tc, seed=seed, out_dir=str(root / "driver"))
    try:
        with SplitDriver(cfg, connect=lambda ref, c: InProcessClient(parties[ref.name], "operator")) as drv:
            res = drv.train()
            exports = drv.checkpoint_all(export=True)
        digest = hashlib.sha256(b"".join(p.state_digest().encode() for p in parties.values())).hexdigest()[:16]
    finally:
        for p in parties.values():
            p.close()
    state = {k: v for m in exports.values() for k, v in load_tensors(m["export"]).items()}
    model.load_state_dict(state)
    return 1 - evaluate(model, data.x_test, data.y_test), 1 - res.curve[-1][1], digest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(1)
    data = load_data(DataConfig(source="digits", seed=0))
    true, told = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for s in range(args.seeds):
            acc, rep, digest = run(s, args.steps, Path(tmp) / f"s{s}", data)
            true.append(acc)
            told.append(rep)
            print(f"seed {s}: accuracy {acc:.4f}  reported {rep:.4f}  (off by {rep - acc:+.4f})  state {digest}")
    print(f"mean accuracy {statistics.mean(true):.4f} (sd {statistics.stdev(true):.4f}); reported "
          f"{statistics.mean(told):.4f}; |reported - true| mean {statistics.mean(abs(a - b) for a, b in zip(true, told, strict=True)):.4f}")


if __name__ == "__main__":
    main()
