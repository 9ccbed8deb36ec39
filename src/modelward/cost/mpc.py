"""Secret-shared inference with MPyC: 3 parties as separate processes on 127.0.0.1 (seed 000 §1: MPC costs
> 24× more compute and > 16 bytes per 16-bit multiplication).

The data owner (party 0) secret-shares its inputs, the model owner (party 1) its weights (once, ``setup_bytes``),
and a helper (party 2) completes the 3-party Shamir scheme (threshold 1: no single party learns anything). The
lowered program (:mod:`modelward.cost.program`) runs on secure fixed-point arrays (``mpc.SecFxp(l, f)``:
``l``-bit numbers with ``f`` fractional bits); each product is followed by MPyC's probabilistic truncation, so
every multiplication can be off by one unit in the last place (2^-f). Only party 0 learns the outputs.

Bytes are MPyC's own per-connection counters (``nbytes_sent``: every message's 12-byte header and payload),
summed over the three parties: everything that crosses the loopback sockets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from pydantic import Field

from modelward.core import ports
from modelward.core.config import StrictModel
from modelward.cost.program import Program
from modelward.cost.result import BackendResult
from modelward.errors import ModelwardError

N_PARTIES = 3


class MPCConfig(StrictModel):
    """``[cost.mpc]``: secure fixed-point format and limits."""

    bit_length: int = Field(32, ge=16, le=128)  # l: bits of a secure fixed-point number
    frac_bits: int = Field(16, ge=4, le=64)  # f: fractional bits (precision 2^-f per multiplication)
    repeats: int = Field(3, ge=1)  # single-sample runs (median)
    train_lr: float = Field(0.05, gt=0)  # the secret-shared SGD step (MSE loss; see mpc_party._train_step)
    timeout_s: float = Field(600.0, gt=0)


class MPCError(ModelwardError):
    """The MPyC parties failed or timed out; the message quotes the end of their logs."""


def mpyc_available() -> str | None:
    """None if MPyC is installed, else the reason. Not imported here: ``import mpyc`` parses this process's
    command line as MPyC options (only the party processes may import it)."""
    import importlib.util

    if importlib.util.find_spec("mpyc") is None:
        return "mpyc is not installed; install the extra: pip install 'modelward[cost]'"
    return None


def free_ports(k: int) -> list[int]:
    """k distinct free TCP ports on 127.0.0.1, outside the range the kernel hands to outgoing connections
    (:func:`modelward.core.ports.free_ports`: no party's connection takes another party's port first)."""
    return ports.free_ports(k)


def write_job(job_dir: Path, program: Program, x: np.ndarray, cfg: MPCConfig,
              train: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """Public job description, the model owner's weights and the data owner's inputs, as separate files."""
    from safetensors.numpy import save_file

    job_dir.mkdir(parents=True, exist_ok=True)
    ops = [{"kind": op.kind, "name": op.name, "shape": list(op.shape) if op.kind == "affine" else None}
           for op in program.ops]
    job = {"ops": ops, "in_features": program.in_features, "out_features": program.out_features,
           "bit_length": cfg.bit_length, "frac_bits": cfg.frac_bits, "n_samples": len(x), "repeats": cfg.repeats,
           "train": None if train is None else {"batch": len(train[0]), "lr": cfg.train_lr}}
    (job_dir / "job.json").write_text(json.dumps(job))
    weights = {}
    for i, op in enumerate(program.ops):
        if op.kind == "affine":
            weights[f"op{i}.weight"] = np.ascontiguousarray(op.weight, dtype=np.float64)
            weights[f"op{i}.bias"] = np.ascontiguousarray(op.bias, dtype=np.float64)
    save_file(weights, str(job_dir / "model.safetensors"))
    save_file({"x": np.ascontiguousarray(x.reshape(len(x), -1), dtype=np.float64)}, str(job_dir / "inputs.safetensors"))
    if train is not None:  # the data owner's training batch: inputs and one-hot targets
        xt, tt = train
        save_file({"x": np.ascontiguousarray(xt.reshape(len(xt), -1), dtype=np.float64),
                   "t": np.ascontiguousarray(tt, dtype=np.float64)}, str(job_dir / "train.safetensors"))


def run_parties(job_dir: Path, timeout_s: float) -> float:
    """Start the 3 party processes on 127.0.0.1 and wait for them; returns the wall time."""
    ports = free_ports(N_PARTIES)
    addrs = [a for p in ports for a in ("-P", f"127.0.0.1:{p}")]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    procs, logs = [], []
    t0 = time.perf_counter()
    for i in range(N_PARTIES):
        log = (job_dir / f"party{i}.log").open("wb")
        logs.append(log)
        procs.append(subprocess.Popen([sys.executable, "-m", "modelward.cost.mpc_party", str(job_dir), *addrs,
                                       "-I", str(i), "--no-log"], stdout=log, stderr=subprocess.STDOUT, env=env))
    try:
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        raise MPCError(f"MPyC parties did not finish within {timeout_s:.0f}s (cost.mpc.timeout_s); "
                       f"logs: {_tails(job_dir)}") from None
    finally:
        for log in logs:
            log.close()
    bad = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode != 0]
    if bad:
        raise MPCError(f"MPyC parties exited with codes {bad}: {_tails(job_dir)}")
    return time.perf_counter() - t0


def _tails(job_dir: Path) -> str:
    out = []
    for i in range(N_PARTIES):
        p = job_dir / f"party{i}.log"
        text = p.read_text(errors="replace")[-800:] if p.is_file() else "(no log)"
        out.append(f"[party {i}] {text}")
    return "\n".join(out)


def run_mpc(program: Program, x: np.ndarray, cfg: MPCConfig, work_dir: Path | None = None,
            train: tuple[np.ndarray, np.ndarray] | None = None) -> BackendResult:
    """Measure 3-party MPyC inference of `program` on the samples `x` (n, features).

    Returns:
        a :class:`BackendResult`: per-sample latency (median of ``cfg.repeats`` single-sample runs, at party 0:
        sharing the input … revealing the output), batch latency, bytes per sample (all parties, batch run / n),
        the weight-sharing bytes and process start + connection time as set-up, and party 0's outputs.
    """
    from safetensors.numpy import load_file

    res = BackendResult("mpc", batch_size=len(x), multiplications=program.multiplications())
    reason = mpyc_available()
    if reason:
        res.status, res.reason = "unavailable", reason
        return res
    tmp = None
    if work_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="modelward-mpc-")
        work_dir = Path(tmp.name)
    try:
        write_job(work_dir, program, x, cfg, train)
        wall = run_parties(work_dir, cfg.timeout_s)
        stats = [json.loads((work_dir / f"stats_{i}.json").read_text()) for i in range(N_PARTIES)]
        y = load_file(str(work_dir / "outputs.safetensors"))["y"]
        trained = load_file(str(work_dir / "trained.safetensors")) if train is not None else None
    finally:
        if tmp is not None:
            tmp.cleanup()
    p0 = stats[0]
    res.latency_sample_s = float(np.median([s for s, _ in p0["sample"]]))
    res.latency_batch_s = float(p0["batch"][0])
    batch_bytes = sum(s["batch"][1] for s in stats)
    res.bytes_per_sample = batch_bytes / len(x)
    res.setup_bytes = float(sum(s["setup_bytes"] for s in stats))
    res.setup_s = wall - sum(s for s, _ in p0["sample"]) - p0["batch"][0] - (p0["train"][0] if "train" in p0 else 0)
    res.outputs = np.asarray(y, dtype=np.float64).reshape(len(x), -1)
    if trained is not None and train is not None:
        res.extra["train"] = {"step_s": float(stats[0]["train"][0]), "batch_size": len(train[0]),
                              "bytes_per_sample": sum(s["train"][1] for s in stats) / len(train[0]),
                              "weights": trained}
    single_bytes = float(np.median([sum(s["sample"][r][1] for s in stats) for r in range(cfg.repeats)]))
    tol_unit = 2.0 ** (8 - cfg.frac_bits)
    res.params = (f"3 parties (Shamir, threshold 1) on 127.0.0.1, secure fixed point l={cfg.bit_length}, "
                  f"f={cfg.frac_bits}, MPyC {_version()}")
    res.precision = f"2^(8-f) = {tol_unit:.2g} × (1 + max|plain|)"
    res.extra.update(tol_scale=tol_unit, bytes_single_sample=single_bytes,
                     bytes_per_multiplication=res.bytes_per_sample / max(1, program.multiplications()),
                     connect_s=max(s["connect_s"] for s in stats))
    return res


def _version() -> str:
    from importlib.metadata import version

    return version("mpyc")
