"""Write the cost table (results.csv / .md / .json) and the log-scale bar plot."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from modelward.core.records import atomic_write_json, write_table

# The seed's claims (000 §1), stored as literature constants next to the measurements, never computed.
SEED_CLAIMS = {"he_slowdown": 1000.0, "mpc_slowdown": 24.0, "mpc_bytes_per_mult": 16.0}

COLUMNS = ["backend", "status", "latency_sample_ms", "latency_batch_ms", "batch", "throughput_per_s",
           "slowdown_sample", "slowdown_batch", "bytes_per_sample", "bytes_per_mult", "setup_bytes", "setup_s",
           "max_abs_diff", "tolerance", "train_step_ms", "train_slowdown", "train_note", "params", "precision",
           "reason"]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "–"
        if v == 0:
            return "0"
        a = abs(v)
        return f"{v:.3g}" if 1e-3 <= a < 1e6 else f"{v:.2e}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def claims(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each seed claim with the measured value and whether it holds here (None when not measured)."""
    by = {r["backend"]: r for r in rows}

    def val(b: str, k: str) -> float:
        r = by.get(b)
        return float(r[k]) if r and r["status"] == "ok" and r[k] is not None else float("nan")

    out = []
    for name, backend, key, bound in [("HE > 1000× slower (per sample)", "he", "slowdown_sample", 1000.0),
                                      ("MPC > 24× more compute (per sample)", "mpc", "slowdown_sample", 24.0),
                                      ("MPC > 16 bytes per multiplication", "mpc", "bytes_per_mult", 16.0)]:
        v = val(backend, key)
        out.append({"claim": name, "measured": v, "holds": (v > bound) if math.isfinite(v) else None})
    return out


def write_results(out: Path, rows: list[dict[str, Any]], info: dict[str, Any], config: dict[str, Any]) -> dict[str, Path]:
    """results.csv/.md/.json (core.records; the .md adds the seed claims and notes), run.json (claims, info,
    config) and latency.png."""
    out.mkdir(parents=True, exist_ok=True)
    cl = claims(rows)
    short = COLUMNS[:16]
    lines = [f"# Cost of plain vs split vs HE vs MPC — {info.get('dataset', '')}, {info.get('samples')} samples",
             "", "| " + " | ".join(short) + " |", "|" + "---|" * len(short)]
    lines += ["| " + " | ".join(_fmt(r.get(k, "")) for k in short) + " |" for r in rows]
    lines += ["", "## Seed 000 §1 claims on this model and machine", "", "| claim | measured | holds |", "|---|---|---|"]
    lines += [f"| {c['claim']} | {_fmt(c['measured'])} | {'–' if c['holds'] is None else c['holds']} |" for c in cl]
    lines += ["", "## Parameters, precision, notes", ""]
    for r in rows:
        lines.append(f"- **{r['backend']}** ({r['status']}): {r['params'] or '–'}; precision: {r['precision'] or '–'}"
                     + (f"; {r['reason']}" if r["reason"] else "")
                     + (f"; training: {r['train_note']}" if r.get("train_note") else ""))
    lines += ["", f"Multiplications per sample: {info.get('multiplications')}; test error of the model: "
              f"{_fmt(info.get('test_error', float('nan')))}. Latencies are medians; bytes are counted on the real "
              "transport (serialized ciphertexts, MPyC socket counters, the driver's gRPC counters on the "
              "cross-party link).", ""]
    paths = write_table(out, "results", rows, COLUMNS, markdown="\n".join(lines))
    paths["run"] = atomic_write_json(out / "run.json", {"claims": cl, "info": info, "config": config})
    paths["plot"] = bar_plot(out / "latency.png", rows)
    return paths


def bar_plot(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Log-scale bars of per-sample and per-batch latency per backend (FAILED / unavailable rows labelled)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = [r["backend"] for r in rows]
    xs = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(rows)), 4.2))
    for off, key, label in [(-0.2, "latency_sample_ms", "per sample"), (0.2, "latency_batch_ms", "per batch")]:
        vals = [r[key] if r["status"] == "ok" and math.isfinite(r[key]) else np.nan for r in rows]
        ax.bar(xs + off, vals, 0.4, label=label)
    for i, r in enumerate(rows):
        if r["status"] != "ok":
            ax.text(i, 0.03, r["status"], ha="center", va="bottom", rotation=90, fontsize=8,
                    transform=ax.get_xaxis_transform())  # x in data, y in axes fraction: safe on a log axis
        elif math.isfinite(r["slowdown_sample"]) and r["backend"] != "plain":
            ax.text(i - 0.2, r["latency_sample_ms"], f"{r['slowdown_sample']:.3g}×", ha="center", va="bottom",
                    fontsize=7)
    ax.set_yscale("log")
    ax.set_xticks(xs, names)
    ax.set_ylabel("latency (ms, log scale)")
    ax.set_title("Inference latency per backend (labels: slowdown vs plain, per sample)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
