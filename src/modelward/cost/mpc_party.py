"""One MPyC party of the secret-shared inference (run as a separate process by :mod:`modelward.cost.mpc`).

    python -m modelward.cost.mpc_party JOB_DIR -I i -P 127.0.0.1:p0 -P 127.0.0.1:p1 -P 127.0.0.1:p2 --no-log

Party 0 is the data owner (reads ``inputs.safetensors``, receives the outputs), party 1 the model owner (reads
``model.safetensors``), party 2 a helper that holds neither. Shapes and fixed-point parameters are public
(``job.json``). Each party records the bytes it sends (MPyC's per-connection ``nbytes_sent`` counters: 12-byte
header + payload per message) and its timings per phase in ``stats_<i>.json``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def _sent(mpc: Any) -> int:
    return sum(p.protocol.nbytes_sent for p in mpc.parties if p.pid != mpc.pid and p.protocol is not None)


async def _main(job_dir: Path) -> None:
    from mpyc.runtime import mpc
    from safetensors.numpy import load_file, save_file  # numpy only: a party never imports torch

    job = json.loads((job_dir / "job.json").read_text())
    stats: dict[str, Any] = {"pid": None}
    t0 = time.perf_counter()
    await mpc.start()
    pid = mpc.pid
    stats["pid"] = pid
    stats["connect_s"] = time.perf_counter() - t0
    secfxp = mpc.SecFxp(int(job["bit_length"]), int(job["frac_bits"]))

    def share(value: np.ndarray | None, shape: list[int], sender: int) -> Any:
        # every party passes an array of the public shape; integral=False everywhere, or the parties would
        # disagree about truncation (MPyC infers `integral` from the values, and placeholders are all zeros)
        arr = np.zeros(shape) if value is None else value
        return mpc.input(secfxp.array(arr, integral=False), senders=sender)

    # --- set-up: the model owner secret-shares its weights once
    b0, t = _sent(mpc), time.perf_counter()
    own = load_file(str(job_dir / "model.safetensors")) if pid == 1 else {}
    layers: list[tuple[str, Any, Any]] = []
    for i, op in enumerate(job["ops"]):
        if op["kind"] == "affine":
            out_f, in_f = op["shape"]
            w = own[f"op{i}.weight"].T if own else None
            b = own[f"op{i}.bias"] if own else None
            layers.append(("affine", share(w, [in_f, out_f], 1), share(b, [out_f], 1)))
        else:
            layers.append(("square", None, None))
    await mpc.barrier()
    stats["setup_bytes"], stats["setup_s"] = _sent(mpc) - b0, time.perf_counter() - t

    x_all = load_file(str(job_dir / "inputs.safetensors"))["x"] if pid == 0 else None
    n, d = int(job["n_samples"]), int(job["in_features"])

    async def forward(rows: slice) -> tuple[np.ndarray | None, float, int]:
        b1, t1 = _sent(mpc), time.perf_counter()
        k = len(range(*rows.indices(n)))
        h = share(x_all[rows] if x_all is not None else None, [k, d], 0)
        for kind, w, b in layers:
            h = h @ w + b if kind == "affine" else h * h
        y = await mpc.output(h, receivers=[0])
        return (None if y is None else np.asarray(y, dtype=np.float64)), time.perf_counter() - t1, _sent(mpc) - b1

    singles = []
    for r in range(int(job["repeats"])):
        _, s, nb = await forward(slice(r % n, r % n + 1))
        singles.append((s, nb))
    stats["sample"] = singles
    y, s, nb = await forward(slice(0, n))
    stats["batch"] = (s, nb)
    if pid == 0 and y is not None:
        save_file({"y": np.ascontiguousarray(y)}, str(job_dir / "outputs.safetensors"))
    if job.get("train"):
        await _train_step(mpc, job, job_dir, layers, share, stats)
    await mpc.barrier()
    stats["total_bytes"] = _sent(mpc)
    (job_dir / f"stats_{pid}.json").write_text(json.dumps(stats))
    await mpc.shutdown()


async def _train_step(mpc: Any, job: dict, job_dir: Path, layers: list, share: Any, stats: dict) -> None:
    """One secret-shared SGD step on the data owner's batch: forward keeping the activations, the gradient of
    L = 1/(2B)·Σ‖y − t‖² (polynomial, unlike softmax cross-entropy), backward through x² (2·a·g) and the affine
    maps, update W ← W − lr·∂L/∂W on shares. The updated weights stay secret-shared; they are revealed to the
    model owner afterwards only so the orchestrator can check them against plain PyTorch (not timed)."""
    from safetensors.numpy import load_file, save_file

    tr = job["train"]
    bsz, lr, pid = int(tr["batch"]), float(tr["lr"]), mpc.pid
    d, c = int(job["in_features"]), int(job["out_features"])
    own = load_file(str(job_dir / "train.safetensors")) if pid == 0 else {}
    b0, t0 = _sent(mpc), time.perf_counter()
    h = share(own.get("x"), [bsz, d], 0)
    t = share(own.get("t"), [bsz, c], 0)
    acts = [h]
    for kind, w, b in layers:
        h = h @ w + b if kind == "affine" else h * h
        acts.append(h)
    g = (h - t) * (1.0 / bsz)
    updated: list[tuple[int, Any, Any]] = []
    for i in range(len(layers) - 1, -1, -1):
        kind, w, b = layers[i]
        a_in = acts[i]
        if kind == "affine":
            updated.append((i, w - lr * (a_in.T @ g), b - lr * g.sum(axis=0)))
            if i > 0:
                g = g @ w.T
        else:
            g = 2 * a_in * g
    for _, w_new, b_new in updated:  # wait until this party holds every updated share (no communication)
        await mpc.gather(w_new)
        await mpc.gather(b_new)
    stats["train"] = (time.perf_counter() - t0, _sent(mpc) - b0)
    out = {}
    for i, w_new, b_new in updated:
        wv = await mpc.output(w_new, receivers=[1])
        bv = await mpc.output(b_new, receivers=[1])
        if pid == 1:
            out[f"op{i}.weight"] = np.ascontiguousarray(np.asarray(wv, dtype=np.float64).T)
            out[f"op{i}.bias"] = np.ascontiguousarray(np.asarray(bv, dtype=np.float64))
    if pid == 1:
        save_file(out, str(job_dir / "trained.safetensors"))


def main() -> None:
    job_dir = Path(sys.argv[1])
    from mpyc.runtime import mpc  # parses the MPyC options (-I, -P, ...) from sys.argv

    mpc.run(_main(job_dir))


if __name__ == "__main__":
    main()
