"""``modelward cost``: the same model on the same inputs five ways — plain, split, HE, MPC, CrypTen (issue 16).

Seed 000 §1 justifies model splitting by the cost of the alternatives (HE > 1000× slower, MPC > 24× more compute
and > 16 bytes per 16-bit multiplication). This module measures those ratios on the user's own model: it trains
(or loads) the model in plaintext, runs every backend on the first ``samples`` test inputs, checks every output
against plain PyTorch (a backend that drifts beyond its stated precision is marked FAILED and no speed is
reported for it), and compares one training step split vs plain.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from modelward.core.config import StrictModel
from modelward.core.data import DataConfig, DataSplit, load_data
from modelward.core.init import init_model_
from modelward.core.io import load_into, load_tensors
from modelward.core.progress import ProgressSink, as_sink
from modelward.core.train import TrainConfig, evaluate, train
from modelward.core.zoo import ModelConfig, build_model
from modelward.cost.he import HEConfig, run_he
from modelward.cost.mpc import MPCConfig, run_mpc
from modelward.cost.program import UnsupportedLayer, lower
from modelward.cost.result import BackendResult, PrecisionError, check_agreement
from modelward.cost.split import run_split
from modelward.errors import ConfigError, ModelwardError
from modelward.governance.plan import PlanError

Backend = Literal["plain", "split", "he", "mpc", "crypten"]
ALL_BACKENDS: tuple[str, ...] = ("plain", "split", "he", "mpc", "crypten")

HE_TRAIN = ("cannot train: TenSEAL has no bootstrapping, so the depth of a forward + backward pass exceeds the "
            "128-bit parameter bound, and the model owner could not apply encrypted gradients to plaintext weights "
            "without the data owner decrypting them")
MPC_TRAIN = "not measured (cost.train_steps = 0 or the MPC row did not run)"
CRYPTEN_WHY = ("CrypTen 0.4.1 (the latest release) declares torchvision, which would replace the CPU torch, and "
               "fails to import on torch 2.13 (No module named 'torch.onnx._internal.registration')")


class CostSettings(StrictModel):
    """``[cost]``: what to measure."""

    backends: list[Backend] = Field(default_factory=lambda: list(ALL_BACKENDS))
    samples: int = Field(16, ge=1)  # test inputs measured; the batch run sends all of them at once
    repeats: int = Field(5, ge=1)  # single-sample runs of plain/split (median)
    cut: str | None = None  # split: the last layer Alice holds (default: the first layer)
    train_steps: int = Field(3, ge=0)  # training comparison (0 = skip)
    train_batch: int = Field(16, ge=1)
    weights: str | None = None  # safetensors state dict of the user's trained model (default: train with [train])
    he: HEConfig = Field(default_factory=HEConfig)
    mpc: MPCConfig = Field(default_factory=MPCConfig)


class CostConfig(StrictModel):
    """The whole ``modelward cost`` config: ``[data]``, ``[model]``, ``[train]`` as elsewhere, plus ``[cost]``.

    Args:
        name / seed: the run's name and seed.
        data: the data source; model: the model (default: ``modelward.cost.models:square_mlp`` with 16 hidden
            units); train: how it is trained when ``cost.weights`` is not given.
        cost: ``[cost]``: the ``backends``, test ``samples``, ``repeats``, the split ``cut``, the training comparison
            (``train_steps``, ``train_batch``), the user's ``weights`` and the ``he`` / ``mpc`` settings.

    Returns:
        A strict config for :func:`run_cost`.

    Example:
        >>> cfg = CostConfig(cost={"backends": ["plain", "he"], "samples": 4})
        >>> cfg.cost.backends, cfg.model.entrypoint
        (['plain', 'he'], 'modelward.cost.models:square_mlp')
    """

    name: str = "cost"
    seed: int = 0
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=lambda: ModelConfig(
        arch="entrypoint", entrypoint="modelward.cost.models:square_mlp", kwargs={"hidden": [16]}))
    train: TrainConfig = Field(default_factory=lambda: TrainConfig(optimizer="adam", lr=0.01, steps=200,
                                                                   batch_size=32, eval_every=50))
    cost: CostSettings = Field(default_factory=CostSettings)


def prepare_model(cfg: CostConfig) -> tuple[torch.nn.Module, DataSplit, dict[str, float]]:
    """Load the data, build the `[model]`, load `cost.weights` or train it with `[train]`; eval mode."""
    data = load_data(cfg.data)
    model = init_model_(build_model(cfg.model, data.input_shape, data.num_classes), "glorot_uniform", cfg.seed)
    info: dict[str, float] = {}
    if cfg.cost.weights:
        state = load_tensors(cfg.cost.weights)
        load_into(model, state, f"cost.weights {cfg.cost.weights}")
    else:
        t = time.perf_counter()
        train(model, data.x_train, data.y_train, data.x_test, data.y_test, cfg.train, cfg.seed)
        info["train_s"] = time.perf_counter() - t
    model.eval()
    info["test_error"] = evaluate(model, data.x_test, data.y_test, "error")
    return model, data, info


def run_plain(model: torch.nn.Module, x: torch.Tensor, repeats: int) -> BackendResult:
    """Plain PyTorch (the floor): median single-sample and batch latency."""
    res = BackendResult("plain", batch_size=len(x), bytes_per_sample=0.0, setup_bytes=0.0, setup_s=0.0)
    with torch.no_grad():
        for _ in range(3):  # warm-up
            model(x)
            model(x[:1])
        singles, batches = [], []
        for r in range(max(repeats, 5)):
            t = time.perf_counter()
            model(x[r % len(x) : r % len(x) + 1])
            singles.append(time.perf_counter() - t)
            t = time.perf_counter()
            out = model(x)
            batches.append(time.perf_counter() - t)
    res.latency_sample_s, res.latency_batch_s = statistics.median(singles), statistics.median(batches)
    res.outputs = out.double().numpy()
    res.params = f"PyTorch {torch.__version__}, float32, {torch.get_num_threads()} thread(s)"
    res.precision = "reference"
    res.extra["tol_scale"] = 0.0
    return res


def crypten_row() -> BackendResult:
    """The optional CrypTen row: whether it imports on this torch, and why not."""
    res = BackendResult("crypten", status="unavailable")
    try:
        import crypten  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure is the finding
        res.reason = f"not importable here ({type(e).__name__}: {e}). {CRYPTEN_WHY}"
        return res
    res.reason = ("crypten imports, but modelward has no CrypTen backend: it could not be built or tested on "
                  f"torch {torch.__version__}")
    return res


def _mpc_train_batch(program: Any, data: DataSplit, s: CostSettings) -> tuple[np.ndarray, np.ndarray] | None:
    """The data owner's training batch (inputs, one-hot targets) when every affine op is a plain Linear layer."""
    if not all(op.dense for op in program.ops if op.kind == "affine"):
        return None
    k = min(len(data.x_train), s.train_batch)
    xt = data.x_train[:k].double().numpy().reshape(k, -1)
    tt = np.eye(data.num_classes)[data.y_train[:k].numpy()]
    return xt, tt


def _mpc_train_compare(model: torch.nn.Module, input_shape: tuple[int, ...], program: Any,
                       batch: tuple[np.ndarray, np.ndarray],
                       res: BackendResult, mcfg: MPCConfig) -> dict[str, Any]:
    """The secret-shared SGD step vs the same step in plain PyTorch (same MSE loss, same lr, same weights)."""
    import copy

    xt, tt = batch
    mpc_w = res.extra["train"].pop("weights")
    ref = program.sgd_mse_step(xt, tt, mcfg.train_lr)
    diff = max(max(float(np.abs(mpc_w[f"op{i}.weight"] - w).max()), float(np.abs(mpc_w[f"op{i}.bias"] - b).max()))
               for i, (w, b) in ref.items())
    scale = max(float(np.abs(w).max()) for w, _ in ref.values())
    tol = float(res.extra["tol_scale"]) * (1.0 + scale)
    x = torch.from_numpy(xt).float().reshape(len(xt), *input_shape)
    t = torch.from_numpy(tt).float()
    times = []
    for _ in range(5):
        m = copy.deepcopy(model).train()
        opt = torch.optim.SGD(m.parameters(), lr=mcfg.train_lr)
        t0 = time.perf_counter()
        loss = 0.5 * ((m(x) - t) ** 2).sum(1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    out = {"mpc_step_s": res.extra["train"]["step_s"], "plain_step_s": statistics.median(times),
           "batch_size": len(xt), "bytes_per_sample": res.extra["train"]["bytes_per_sample"],
           "weights_max_abs_diff": diff, "tolerance": tol, "ok": diff <= tol}
    if diff > tol:
        out["note"] = (f"FAILED: the secret-shared SGD step's weights drift from plain by {diff:.3g} > {tol:.3g} "
                       f"({res.precision})")
    return out


def _fresh(work_dir: Path | None, name: str) -> Path | None:
    """A clean scratch folder per measurement (certificates, audit logs and job files of the previous run go)."""
    if work_dir is None:
        return None
    import shutil

    sub = Path(work_dir) / name
    shutil.rmtree(sub, ignore_errors=True)
    sub.mkdir(parents=True)
    return sub


def run_cost(cfg: CostConfig, work_dir: Path | None = None, progress: ProgressSink | None = None,
             log: Any = None) -> tuple[list[BackendResult], dict[str, Any]]:
    """Run every configured backend; returns (results in backend order, run info incl. training comparison).

    Args:
        cfg: the config.
        work_dir: where party processes keep their files (default: temporary folders).
        progress: a ProgressSink (``start``/``advance``/``done``); None = silent.
        log: optional ``callable(str)`` for one-line status messages.

    Returns:
        ``(results, info)``: one :class:`~modelward.cost.result.BackendResult` per backend (``plain`` first, always
        measured as the reference) and a dict of run information (training time, the training comparison).

    Example:
        >>> results, info = run_cost(CostConfig(cost={"backends": ["plain", "split"]}))  # doctest: +SKIP
        >>> [r.status for r in results]  # doctest: +SKIP
    """
    progress = as_sink(progress)
    say = log or (lambda _msg: None)
    s = cfg.cost
    backends = list(dict.fromkeys(["plain", *s.backends]))  # plain is the reference, always measured
    model, data, info = prepare_model(cfg)
    n = min(s.samples, len(data.x_test))
    x = data.x_test[:n].float()
    try:
        info["multiplications"] = lower(model, data.input_shape).multiplications()
    except UnsupportedLayer:
        info["multiplications"] = 0  # not a polynomial network: no multiplication count for bytes/mult
    say(f"{data.name}: model trained/loaded (test error {info['test_error']:.3f}); measuring {n} test samples")
    progress.start("cost", len(backends), "backends")
    results: dict[str, BackendResult] = {}
    training: dict[str, Any] | None = None
    mpc_training: dict[str, Any] | None = None
    plain = run_plain(model, x, s.repeats)
    results["plain"] = plain
    ref = plain.outputs
    assert ref is not None
    progress.advance("cost", info="plain")
    for b in backends[1:]:
        t = time.perf_counter()
        say(f"{b}: running …")
        try:
            if b == "crypten":
                res = crypten_row()
            elif b == "split":
                tb = None
                if s.train_steps:
                    k = min(len(data.x_train), s.train_steps * s.train_batch)
                    tb = (data.x_train[:k], data.y_train[:k])
                sub = _fresh(work_dir, "split")
                res, training = run_split(model, cfg.model, data.input_shape, data.num_classes, x, s.repeats,
                                          s.cut, tb, cfg.train, s.train_steps, sub)
            else:
                program = lower(model, data.input_shape, backend=b)
                xs = x.double().numpy().reshape(n, -1)
                if b == "he":
                    res = run_he(program, xs, s.he)
                else:
                    sub = _fresh(work_dir, "mpc")
                    tb_np = _mpc_train_batch(program, data, s) if s.train_steps else None
                    res = run_mpc(program, xs, s.mpc, sub, tb_np)
                    if tb_np is not None and res.status == "ok":
                        mpc_training = _mpc_train_compare(model, data.input_shape, program, tb_np, res, s.mpc)
                    elif s.train_steps:
                        mpc_training = {"note": "cannot train in MPC here: the secret-shared SGD step trains "
                                        "nn.Linear layers only; convolutions/pooling are lowered to dense matrices "
                                        "(their weight sharing would be lost)"}
        except (UnsupportedLayer, PlanError, ConfigError) as e:  # the model (or its depth) does not fit the backend
            res = BackendResult(b, status="unsupported", reason=f"{type(e).__name__}: {e}")
        except ModelwardError as e:  # a party process or the MPC run failed: say so, measure the other backends
            res = BackendResult(b, status="error", reason=f"{type(e).__name__}: {e}")
        if res.status == "ok" and res.outputs is not None:
            tol = float(res.extra.get("tol_scale", 0.0)) * (1.0 + float(np.abs(ref).max()))
            res.tolerance = tol
            try:
                res.max_abs_diff = check_agreement(b, res.outputs, ref, tol, res.precision)
            except PrecisionError as e:
                res.max_abs_diff = float(np.abs(res.outputs - ref).max())
                res.fail(str(e))
        results[b] = res
        say(f"{b}: {res.status} in {time.perf_counter() - t:.1f}s {res.reason[:200]}")
        progress.advance("cost", info=f"{b}: {res.status}")
    progress.done("cost")
    plain.max_abs_diff, plain.tolerance = 0.0, 0.0
    info.update(train_steps=s.train_steps, samples=n, dataset=data.name, input_shape=list(data.input_shape), num_classes=data.num_classes,
                training=training, mpc_training=mpc_training)
    return [results[b] for b in backends], info


def table_rows(results: list[BackendResult], info: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per backend: latencies (ms), throughput, slowdowns vs plain, bytes, agreement, training."""
    plain = next(r for r in results if r.backend == "plain")
    training = info.get("training") or {}
    mpc_tr = info.get("mpc_training") or {}
    rows = []
    for r in results:
        ok = r.status == "ok"

        def ratio(a: float, b: float, ok: bool = ok) -> float:
            return a / b if ok and math.isfinite(a) and b > 0 else float("nan")

        mults = int(info.get("multiplications") or 0)
        row: dict[str, Any] = {
            "backend": r.backend, "status": r.status,
            "latency_sample_ms": 1e3 * r.latency_sample_s, "latency_batch_ms": 1e3 * r.latency_batch_s,
            "batch": r.batch_size, "throughput_per_s": r.throughput if ok else float("nan"),
            "slowdown_sample": ratio(r.latency_sample_s, plain.latency_sample_s),
            "slowdown_batch": ratio(r.latency_batch_s, plain.latency_batch_s),
            "bytes_per_sample": r.bytes_per_sample,
            "bytes_per_mult": r.bytes_per_sample / mults if ok and mults and r.backend != "plain" else float("nan"),
            "setup_bytes": r.setup_bytes, "setup_s": r.setup_s,
            "max_abs_diff": r.max_abs_diff, "tolerance": r.tolerance,
        }
        if r.backend == "plain" and training:
            row["train_step_ms"], row["train_slowdown"] = 1e3 * training["plain_step_s"], 1.0
            row["train_note"] = f"batch {training['batch_size']}, reference for split"
        elif r.backend == "split" and training:
            row["train_step_ms"] = 1e3 * training["split_step_s"]
            row["train_slowdown"] = training["split_step_s"] / training["plain_step_s"]
            row["train_note"] = (f"[train] optimizer, cross-entropy, batch {training['batch_size']}; "
                                 f"{training['split_bytes_per_sample']:.0f} B/sample on the wire; parameters |Δ| "
                                 f"{training['param_max_abs_diff']:.2g} vs plain")
        elif r.backend == "mpc" and mpc_tr and "mpc_step_s" in mpc_tr and mpc_tr["ok"]:
            row["train_step_ms"] = 1e3 * mpc_tr["mpc_step_s"]
            row["train_slowdown"] = mpc_tr["mpc_step_s"] / mpc_tr["plain_step_s"]
            row["train_note"] = (f"SGD on MSE (softmax is not polynomial), batch {mpc_tr['batch_size']}; vs the same "
                                 f"plain step ({1e3 * mpc_tr['plain_step_s']:.3g} ms); "
                                 f"{mpc_tr['bytes_per_sample']:.3g} B/sample; weights |Δ| "
                                 f"{mpc_tr['weights_max_abs_diff']:.2g} ≤ {mpc_tr['tolerance']:.2g}")
        elif r.backend == "mpc" and mpc_tr:
            row["train_step_ms"] = row["train_slowdown"] = float("nan")
            row["train_note"] = mpc_tr["note"]
        else:
            row["train_step_ms"] = row["train_slowdown"] = float("nan")
            row["train_note"] = {"he": HE_TRAIN, "mpc": MPC_TRAIN, "crypten": "not available"}.get(
                r.backend, "no split run" if r.backend == "plain" and info.get("train_steps") else
                "training comparison off (cost.train_steps = 0)")
        row["params"] = r.params
        row["precision"] = r.precision
        row["reason"] = r.reason
        rows.append(row)
    return rows


def check_backends(names: list[str]) -> None:
    bad = [b for b in names if b not in ALL_BACKENDS]
    if bad:
        raise ConfigError(f"cost.backends: unknown {bad}; valid choices: {list(ALL_BACKENDS)}")
