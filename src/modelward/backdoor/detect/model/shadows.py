"""Shadow models for MNTD (:mod:`modelward.backdoor.detect.model.mntd`): clean models and jumbo-backdoored models
trained with the suspect's architecture and recipe on the defender's clean data, and clean calibration shadows held
out from the meta-training. Training goes through the run ledger (``<out>/ledger.sqlite``): each shadow is one run,
its weights a safetensors file under ``<out>/shadows/``; an interrupted job resumes with the shadows not yet done.

Run ids: ``surrogate`` (the clean model the clean-label jumbo draws perturb their rows against, trained first),
``clean-i``, ``jumbo-i``, ``calib-i``. Seeds are ``seed + offset`` (clean 0…, jumbo 10 000…, calibration 20 000…,
surrogate 30 000): disjoint from a study's model seeds only if the caller picks ``seed`` so (the bench uses 70 000).
A jumbo shadow whose attack does not take (ASR < ``min_asr`` on the data's test split) is kept on disk but not used
as a "backdoored" example: it is not one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from modelward.backdoor.attacks.base import attack_success_rate
from modelward.backdoor.detect.model.mntd import JUMBO_VERSION, JumboDraw, draw_jumbo, jumbo_attack
from modelward.core.data import DataSplit
from modelward.core.init import init_model_
from modelward.core.io import load_state_dict, save_state_dict
from modelward.core.ledger import RunLedger
from modelward.core.progress import ProgressSink, as_sink
from modelward.core.seed import seeded
from modelward.core.train import TrainConfig, train
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError

OFFSETS = {"clean": 0, "jumbo": 10_000, "calib": 20_000, "surrogate": 30_000}


@dataclass
class ShadowSet:
    """Trained shadows: the meta-training set (``models``, ``labels``: 1 backdoored) and the clean calibration set."""

    models: list[nn.Module]
    labels: list[int]
    calibration: list[nn.Module]
    records: dict[str, dict[str, Any]]
    seconds: float


def _fresh(model_cfg: ModelConfig, data: DataSplit, seed: int) -> nn.Module:
    return init_model_(build_model(model_cfg, data.input_shape, data.num_classes), "glorot_uniform", seed)


def _train(model_cfg: ModelConfig, train_cfg: TrainConfig, data: DataSplit, x: torch.Tensor, y: torch.Tensor,
           seed: int) -> nn.Module:
    with seeded(seed):
        model = _fresh(model_cfg, data, seed)
        train(model, x, y, data.x_test, data.y_test, train_cfg, seed)
    return model.eval()


def _load(path: Path, model_cfg: ModelConfig, data: DataSplit) -> nn.Module:
    model = build_model(model_cfg, data.input_shape, data.num_classes)
    model.load_state_dict(load_state_dict(path)[0])
    return model.eval()


def fingerprint(data: DataSplit, model_cfg: ModelConfig, train_cfg: TrainConfig, clip: tuple[float, float], seed: int,
                clean_label_share: float, jumbo_version: int) -> dict[str, Any]:
    """What a shadow ledger is bound to: a resume with anything else is refused."""
    return {"data": data.name, "input_shape": list(data.input_shape), "n_train": len(data.y_train),
            "model": model_cfg.model_dump(mode="json"), "train": train_cfg.model_dump(mode="json"),
            "clip": list(clip), "seed": seed, "clean_label_share": clean_label_share, "jumbo": jumbo_version}


def reuse_clean_shadows(src: str | Path, out: str | Path, config: dict[str, Any]) -> int:
    """Start the shadow folder ``out`` (bound to ``config``, a :func:`fingerprint`) with the surrogate, clean and
    calibration shadows of ``src``: they do not depend on the jumbo distribution, so another jumbo version or share
    need not retrain them. The caller vouches that the rest of ``config`` is ``src``'s. Returns how many were copied."""
    src, out = Path(src), Path(out)
    (out / "shadows").mkdir(parents=True, exist_ok=True)
    old, new = RunLedger(src / "ledger.sqlite"), RunLedger(out / "ledger.sqlite")
    new.bind_config(config)
    n = 0
    for rid, result in old.results().items():
        if rid.startswith("jumbo") or new.status(rid) == "done":
            continue
        (out / "shadows" / f"{rid}.safetensors").write_bytes((src / "shadows" / f"{rid}.safetensors").read_bytes())
        new.add(rid, old.spec(rid))
        new.start(rid)
        new.finish(rid, result)
        n += 1
    return n


def train_shadows(out: str | Path, data: DataSplit, model_cfg: ModelConfig, train_cfg: TrainConfig,
                  clip: tuple[float, float], clean: int = 24, jumbo: int = 24, calibration: int = 20, seed: int = 0,
                  clean_label_share: float = 0.5, min_asr: float = 0.5, progress: ProgressSink | None = None,
                  jumbo_version: int = JUMBO_VERSION) -> ShadowSet:
    """Train (or resume) the shadows of one data set and recipe under ``out``.

    Args:
        out: the folder (ledger, shadow weights); data: the defender's clean data (training split = what shadows
            train on; test split = where a jumbo shadow's ASR is measured); model_cfg, train_cfg: the suspect's
            architecture and recipe; clip: the input box; clean, jumbo, calibration: how many of each;
            seed: the base seed; clean_label_share: the share of label-consistent jumbo draws; min_asr: a jumbo
            shadow counts as backdoored from this ASR on; jumbo_version: :func:`draw_jumbo`'s version (2 reproduces
            the shadows of the fifth round's first measurement).

    Returns:
        A :class:`ShadowSet`.
    """
    if clean < 1 or jumbo < 1 or calibration < 1:
        raise ConfigError(f"mntd shadows: clean, jumbo and calibration must each be ≥ 1 (got {clean}, {jumbo}, "
                          f"{calibration})")
    t0 = time.perf_counter()
    out = Path(out)
    (out / "shadows").mkdir(parents=True, exist_ok=True)
    ledger = RunLedger(out / "ledger.sqlite")
    ledger.bind_config(fingerprint(data, model_cfg, train_cfg, clip, seed, clean_label_share, jumbo_version))
    ledger.recover()
    ids = (["surrogate"] + [f"clean-{i}" for i in range(clean)] + [f"jumbo-{i}" for i in range(jumbo)]
           + [f"calib-{i}" for i in range(calibration)])
    for rid in ids:
        kind, _, idx = rid.partition("-")
        ledger.add(rid, {"kind": kind, "seed": seed + OFFSETS[kind] + int(idx or 0)})
    sink = as_sink(progress)
    todo = [r for r in ids if ledger.status(r) != "done"]
    sink.start("mntd-shadows", len(ids), f"MNTD: {len(todo)} of {len(ids)} shadow models to train")
    sink.advance("mntd-shadows", len(ids) - len(todo))
    share = np.bincount(data.y_train.numpy(), minlength=data.num_classes) / len(data.y_train)
    surrogate: nn.Module | None = None
    for rid in todo:
        spec = ledger.spec(rid)
        if not ledger.start(rid):
            continue
        t1 = time.perf_counter()
        s = int(spec["seed"])
        result: dict[str, Any] = {"seed": s}
        if spec["kind"] == "jumbo":
            if surrogate is None:
                surrogate = _load(out / "shadows" / "surrogate.safetensors", model_cfg, data)
            draw = draw_jumbo(np.random.default_rng(s), data.input_shape, share, clean_label_share, jumbo_version)
            attack = jumbo_attack(draw, data.input_shape, clip, s, surrogate)
            ps = attack.poison(data.x_train, data.y_train)
            model = _train(model_cfg, train_cfg, data, ps.x, ps.y, s)
            hits, n = attack_success_rate(model, attack.apply, data.x_test, data.y_test, draw.target)
            result.update({"draw": draw.to_dict(), "asr": hits / max(n, 1), "asr_hits": hits, "asr_n": n,
                           "rows_poisoned": ps.n_poisoned})
        else:
            model = _train(model_cfg, train_cfg, data, data.x_train, data.y_train, s)
        save_state_dict(out / "shadows" / f"{rid}.safetensors", {k: v.cpu() for k, v in model.state_dict().items()})
        if rid == "surrogate":
            surrogate = model
        result["seconds"] = time.perf_counter() - t1
        ledger.finish(rid, result)
        info = f"{rid}" + (f" asr {result['asr']:.2f}" if "asr" in result else "")
        sink.advance("mntd-shadows", 1, info)
    sink.done("mntd-shadows")
    records = ledger.results()
    models: list[nn.Module] = []
    labels: list[int] = []
    calib: list[nn.Module] = []
    for rid in ids[1:]:
        m = _load(out / "shadows" / f"{rid}.safetensors", model_cfg, data)
        if rid.startswith("calib"):
            calib.append(m)
        elif rid.startswith("clean"):
            models.append(m)
            labels.append(0)
        elif float(records[rid]["asr"]) >= min_asr:
            models.append(m)
            labels.append(1)
    if len(set(labels)) < 2:
        raise ConfigError(f"mntd shadows: no jumbo shadow reached ASR {min_asr} (of {jumbo}); train more "
                          "(detect.mntd.jumbo_shadows)")
    return ShadowSet(models, labels, calib, records, time.perf_counter() - t0)


def jumbo_draws(records: dict[str, dict[str, Any]]) -> list[JumboDraw]:
    """The draws recorded in a shadow ledger's results (for reports)."""
    return [JumboDraw(**r["draw"]) for k, r in sorted(records.items()) if k.startswith("jumbo") and "draw" in r]


def describe(records: dict[str, dict[str, Any]], min_asr: float = 0.5) -> dict[str, Any]:
    """Counts of a shadow set: jumbo shadows, how many took (ASR ≥ min_asr), by kind and label mode."""
    jumbo = [r for k, r in records.items() if k.startswith("jumbo")]
    took = [r for r in jumbo if r["asr"] >= min_asr]
    return {"jumbo": len(jumbo), "jumbo_effective": len(took),
            "clean_label_effective": sum(r["draw"]["clean_label"] for r in took),
            "clean_label_drawn": sum(r["draw"]["clean_label"] for r in jumbo),
            "seconds": float(sum(r["seconds"] for r in records.values()))}
