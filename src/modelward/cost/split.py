"""The governance path as a cost backend: the model split between two party processes (gRPC + mutual TLS on
127.0.0.1), driven by :class:`modelward.governance.driver.SplitDriver` (seed 000 §1, steps 1–5).

Alice (the data owner) holds the layers up to ``cut``, Bob the rest and the labels; the parties talk peer to
peer (Alice → Bob activations, Bob → Alice gradients) and the driver, Alice's identity, starts passes and
collects the logits from Bob. Latency is measured by the driver around whole split passes (TLS framing, consent
checks, two-phase commits and audit-log writes included: that is the governance path's real cost). Bytes are the
governance wire counters of the links that cross organisations: Alice↔Bob (Alice's peer-link counters, read via
``status``) plus driver↔Bob; the driver↔Alice link is local to Alice and reported apart
(``extra.alice_local_bytes_per_sample``).

Training: ``train_steps`` protocol steps (forward, loss + backward at Bob, backward at Alice, both optimizers
step) against the same number of plain PyTorch steps from the same weights on the same batches; the per-step
losses must agree to float32 precision.
"""

from __future__ import annotations

import copy
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from modelward.core.config import to_toml
from modelward.core.io import load_tensors, save_tensors
from modelward.core.train import TrainConfig, make_optimizer
from modelward.core.zoo import ModelConfig
from modelward.cost.result import BackendResult
from modelward.governance.driver import PartyRef, SplitConfig, SplitDriver
from modelward.governance.party.config import TLSConfig
from modelward.governance.plan import make_plan, model_layers, segment_of
from modelward.governance.transport.launch import start_parties, stop_parties
from modelward.governance.trust.certs import make_certs

PARTIES = ("alice", "bob")


def default_cut(model: nn.Module) -> str:
    """The first layer (Alice keeps as little as possible, as in the paper's Alice/Bob example)."""
    return model_layers(model)[0].name


def write_parties(root: Path, model: nn.Module, model_cfg: ModelConfig, input_shape: tuple[int, ...],
                  num_classes: int, cut: str, x: torch.Tensor, x_train: torch.Tensor,
                  y_train: torch.Tensor) -> tuple[dict[str, Path], TLSConfig]:
    """Certificates, each party's own weights and data column, and PARTY.toml files under `root`.

    Like :func:`modelward.governance.demo.prepare_local_split` (peers pinned by their certificate files, chain
    roles, the driver is Alice), but the architecture comes from the user's ``[model]`` config, so any splittable
    model works, not only the zoo MLP/CNN. Each party's init checkpoint holds only its own layers' entries.
    """
    # absolute: the PARTY.toml files name these paths, and a party resolves relative paths against its own file's
    # folder, which would double a relative --out (runs/x/split/runs/x/split/certs/...)
    root = Path(root).resolve()
    plan = make_plan(model, list(PARTIES), [cut])
    make_certs(root / "certs", list(PARTIES), if_exists="reuse")
    own = {"alice": {"x_train": x_train.float().contiguous(), "x_test": x.float().contiguous()},
           "bob": {"y_train": y_train.long().contiguous(), "y_test": torch.zeros(len(x), dtype=torch.long)}}
    configs = {}
    for i, p in enumerate(PARTIES):
        other = PARTIES[1 - i]
        init = root / p / "init.safetensors"
        save_tensors(init, {k: v.detach().contiguous() for k, v in segment_of(model, plan.owners[p]).state_dict()
                            .items()})
        save_tensors(root / p / "data.safetensors", own[p])
        cfg: dict[str, Any] = {
            "name": p, "host": "127.0.0.1", "port": 0, "layers": plan.owners[p],
            "input_shape": list(input_shape), "num_classes": int(num_classes),
            "checkpoint_dir": str(root / p / "checkpoints"), "checkpoint_every": 1000,
            "audit_db": str(root / p / "audit.db"), "threads": 1,
            "model": model_cfg.model_dump(mode="json", exclude_none=True),
            "init": {"checkpoint": str(init)},
            # the driver (alice) receives the raw outputs: the cost study compares them with plain PyTorch's
            "policy": {"allow_peers": ["alice"], "training": True, "inference": True,
                       "predict": {"result_receiver": "alice", "form": "logits"}},
            "peers": {other: {"cert": str(root / f"certs/{other}.pem")}}, "driver": "alice",
            "data": {"file": str(root / p / "data.safetensors")},
            "tls": {"ca": str(root / "certs/ca.pem"), "cert": str(root / f"certs/{p}.pem"),
                    "key": str(root / f"certs/{p}.key")},
        }
        cfg["next" if p == "alice" else "prev"] = other
        if p == "bob":  # exact gradients: the training comparison runs the same steps as plain PyTorch
            cfg["label_protection"] = {"method": "none"}
        path = root / f"party_{p}.toml"
        path.write_text(to_toml(cfg))
        configs[p] = path
    tls = TLSConfig(ca=str(root / "certs/ca.pem"), cert=str(root / "certs/alice.pem"),
                    key=str(root / "certs/alice.key"))
    return configs, tls


def _bytes(drv: SplitDriver) -> dict[str, int]:
    """Cross-organisation bytes so far: Alice↔Bob (peer link, Alice's counters) and driver↔Bob.

    The driver is Alice's, so the driver↔Alice link is local to Alice and reported apart.
    """
    link = drv.call("alice", "status").meta.get("link") or {}
    peer = int(link.get("sent", 0)) + int(link.get("received", 0))
    links = drv.links
    return {"cross": peer + links["bob"].sent + links["bob"].received,
            "alice_local": links["alice"].sent + links["alice"].received}


def run_split(model: nn.Module, model_cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int,
              x: torch.Tensor, repeats: int, cut: str | None = None, train_batch: tuple[torch.Tensor, torch.Tensor]
              | None = None, train_cfg: TrainConfig | None = None, train_steps: int = 3,
              work_dir: Path | None = None) -> tuple[BackendResult, dict[str, Any] | None]:
    """Measure split inference (and optionally split training steps) of `model` on `x`.

    Args:
        model: the trained model (its weights are the parties' initial checkpoint).
        model_cfg: the ``[model]`` config the party processes rebuild the architecture from.
        x: the samples (n, *input_shape); the batch run sends all n at once.
        repeats: single-sample runs (median).
        cut: the last layer Alice holds (default: the first layer).
        train_batch: (x_train, y_train) of ``train_steps × batch`` samples for the training comparison.
    Returns:
        (inference result, training comparison dict or None).
    """
    cut = cut or default_cut(model)
    tmp = None
    if work_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="modelward-split-")
        work_dir = Path(tmp.name)
    xt, yt = train_batch if train_batch is not None else (x[:1], torch.zeros(1, dtype=torch.long))
    res = BackendResult("split", batch_size=len(x))
    training: dict[str, Any] | None = None
    t0 = time.perf_counter()
    configs, tls = write_parties(work_dir, model, model_cfg, input_shape, num_classes, cut, x, xt, yt)
    procs = start_parties(configs, {n: work_dir / n / "server.log" for n in configs})
    try:
        tc = train_cfg or TrainConfig()
        tc = tc.model_copy(update={"batch_size": max(1, len(xt) // max(1, train_steps)), "steps": train_steps})
        scfg = SplitConfig(parties=[PartyRef(name=n, address=procs[n].address, cert=str(work_dir / f"certs/{n}.pem"))
                                    for n in PARTIES], tls=tls,
                           train=tc, seed=0, out_dir=str(work_dir / "driver"))
        with SplitDriver(scfg) as drv:
            drv.open(train=train_batch is not None)
            res.setup_s = time.perf_counter() - t0
            drv.predict(x=x[:1].float(), batch_size=1)  # warm-up (channel and kernel set-up)
            singles = []
            for r in range(max(1, repeats)):
                t = time.perf_counter()
                drv.predict(x=x[r % len(x) : r % len(x) + 1].float(), batch_size=1)
                singles.append(time.perf_counter() - t)
            before = _bytes(drv)
            t = time.perf_counter()
            out = drv.predict(x=x.float(), batch_size=len(x))
            res.latency_batch_s = time.perf_counter() - t
            after = _bytes(drv)
            res.latency_sample_s = statistics.median(singles)
            res.outputs = out.double().numpy()
            res.bytes_per_sample = (after["cross"] - before["cross"]) / len(x)
            res.extra["alice_local_bytes_per_sample"] = (after["alice_local"] - before["alice_local"]) / len(x)
            if train_batch is not None:
                training = _train_compare(drv, model, xt, yt, tc, train_steps)
    finally:
        stop_parties(list(procs.values()))
        if tmp is not None:
            tmp.cleanup()
    owners = make_plan(model, list(PARTIES), [cut]).owners
    res.params = f"alice {owners['alice']} | bob {owners['bob']}; gRPC + mutual TLS on 127.0.0.1, float32"
    res.precision = "float32: 1e-5 × (1 + max|plain|)"
    res.extra["tol_scale"] = 1e-5
    res.setup_bytes = 0.0
    return res, training


def _train_compare(drv: SplitDriver, model: nn.Module, xt: torch.Tensor, yt: torch.Tensor, tc: TrainConfig,
                   steps: int) -> dict[str, Any]:
    """`steps` split training steps vs the same plain steps from the same weights on the same batches, compared by
    the parameters the parties export afterwards (a step's loss never leaves the label holder: issue 36)."""
    bs = tc.batch_size
    batches = [torch.arange(i * bs, (i + 1) * bs) for i in range(steps)]
    split_t, wire = [], []
    for s, idx in enumerate(batches):
        b0 = _bytes(drv)["cross"]
        t = time.perf_counter()
        drv.train_step(s, idx)
        split_t.append(time.perf_counter() - t)
        wire.append((_bytes(drv)["cross"] - b0) / bs)
    exported: dict[str, torch.Tensor] = {}
    for meta in drv.checkpoint_all(export=True).values():  # (local parties: their folders are readable here)
        exported.update(load_tensors(meta["export"]))
    warm = copy.deepcopy(model).float().train()  # warm-up on a throw-away copy (the parties warm up on open too)
    F.cross_entropy(warm(xt[batches[0]].float()), yt[batches[0]].long()).backward()
    plain = copy.deepcopy(model).float().train()
    opt = make_optimizer(list(plain.parameters()), tc)
    plain_t, plain_loss = [], []
    for idx in batches:
        t = time.perf_counter()
        loss = F.cross_entropy(plain(xt[idx].float()), yt[idx].long())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        plain_t.append(time.perf_counter() - t)
        plain_loss.append(float(loss.detach()))
    plain_state = plain.state_dict()
    diff = max(float((exported[k].double() - v.double()).abs().max()) for k, v in plain_state.items()
               if k in exported and v.is_floating_point())
    scale = max(float(v.abs().max()) for v in plain_state.values() if v.is_floating_point() and v.numel())
    return {"split_step_s": statistics.median(split_t), "plain_step_s": statistics.median(plain_t),
            "batch_size": bs, "steps": steps, "split_bytes_per_sample": statistics.median(wire),
            "param_max_abs_diff": diff, "param_scale": scale, "plain_losses": plain_loss}
