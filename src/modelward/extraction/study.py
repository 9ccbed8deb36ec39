"""Extraction evaluation harness (seed 003 §4.1–4.2): every defense × ε × attack × seed cell trains a substitute
through the attack and records the extraction accuracy (best over substitute epochs, as the official code), the
fidelity at that epoch (agreement with the victim's clean top-1), the max/mean ℓ1 distortion of the answers, the
protected accuracy (victim's accuracy through the defense) and, where the clean predictions are known, the mean
recovery distance ‖ỹ − y‖₂. Per defense the worst case is the maximum over attacks.

Split along its seams like the completion study: :mod:`~modelward.extraction.config` (the file and its cells),
:mod:`~modelward.extraction.prepare` (victim, pool, eval set), this module (one cell, and the whole evaluation on
:func:`modelward.core.runner.run_plan`, so an interrupted evaluation resumes where it stopped) and
:mod:`~modelward.extraction.report` (tables and plots). The victim is queried locally (model + defense), through
the guarded HTTP service on 127.0.0.1 (``victim.serve = true``), or at a remote URL (``victim.url``).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import torch

from modelward.core.device import resolve_device
from modelward.core.progress import ProgressSink
from modelward.core.runner import Execute, RunOutcome, RunSpec
from modelward.core.study import Study, StudyContext, run_study, torch_threads
from modelward.errors import ConfigError
from modelward.extraction.attacks import ATTACK_STRATEGIES, knowledge_from_defense, make_extraction_attack
from modelward.extraction.config import Cell, ExtractionConfig, cell_from_spec, cells, plan
from modelward.extraction.guard.process import start_guard_server, write_guard_config
from modelward.extraction.prepare import (
    Prepared,
    cell_defense,
    centroid_count,
    centroid_curves,
    clean_fn,
    fold_temperature,
    prepare,
)
from modelward.extraction.report import row, write_report
from modelward.extraction.victim import HttpVictim, LocalVictim


class _Recording:
    """Wraps a remote victim and records the ℓ1 distortion of its answers when the clean model is known."""

    def __init__(self, inner: Any, clean: Callable[[torch.Tensor], torch.Tensor] | None) -> None:
        self.inner, self._clean = inner, clean
        self.max_l1, self._sum, self._n = 0.0, 0.0, 0

    @property
    def num_classes(self) -> int:
        return int(self.inner.num_classes)

    @property
    def queries_used(self) -> int:
        return int(self.inner.queries_used)

    @property
    def mean_l1(self) -> float:
        return self._sum / self._n if self._n else float("nan")

    def query(self, x: torch.Tensor) -> torch.Tensor:
        ans = self.inner.query(x)
        if self._clean is not None:
            d = (ans.double() - self._clean(x).double()).abs().sum(1)
            self.max_l1 = max(self.max_l1, float(d.max()) if len(d) else 0.0)
            self._sum += float(d.sum())
            self._n += len(d)
        return ans


def run_cell(cfg: ExtractionConfig, prep: Prepared, cell: Cell, workdir: Path) -> dict[str, Any]:
    """Run one defense × ε × attack × seed and return its metrics (JSON-serialisable)."""
    t0 = time.perf_counter()
    defense = cell_defense(cell.defense, cell.epsilon, prep, cell.seed)
    clean = clean_fn(prep.victim)
    attack = make_extraction_attack(cell.attack.query, cell.attack.strategy, cell.attack.query_params,
                         cell.attack.strategy_params, cfg.substitute)
    server = None
    inner: Any = None
    try:
        if cfg.victim.url:
            if defense.stateful and ATTACK_STRATEGIES.get(cell.attack.strategy).needs_knowledge:
                raise ConfigError("victim.url: adaptive attacks against a stateful defense need the server's "
                                  "quantizer state, which a remote victim does not reveal; use a local victim")
            inner = HttpVictim(cfg.victim.url, cfg.victim.model_name, cfg.victim.api_key)
            victim: Any = _Recording(inner, None)
            knowledge = knowledge_from_defense(defense, None)
        elif cfg.victim.serve:
            server, inner = _serve(cfg, prep, cell, workdir)
            victim = _Recording(inner, clean)
            knowledge = knowledge_from_defense(defense, clean)
            if defense.stateful and ATTACK_STRATEGIES.get(cell.attack.strategy).needs_knowledge:
                raise ConfigError("victim.serve: adaptive attacks against a stateful defense need the server's "
                                  "quantizer state; run them with a local victim (victim.serve = false)")
        else:
            victim = LocalVictim(prep.victim, defense, num_classes=prep.data.num_classes)
            knowledge = knowledge_from_defense(defense, clean)

        dev = resolve_device(cfg.device)

        def substitute() -> torch.nn.Module:  # initialised on the CPU (the same weights everywhere), then moved
            return prep.substitute_factory().to(dev)

        result = attack.run(victim, prep.transfer, cfg.budget, substitute, seed=cell.seed,
                            eval_set=prep.eval_set, knowledge=knowledge)
        max_l1, mean_l1 = victim.max_l1, victim.mean_l1
        if cfg.victim.url:
            max_l1 = mean_l1 = float("nan")
            protected = _remote_accuracy(inner, prep)
        else:
            protected = protected_accuracy(cell, prep)
    finally:
        if inner is not None and hasattr(inner, "close"):
            inner.close()
        if server is not None:
            server.stop()
    out = result.to_dict()
    out.pop("curve")
    out.update({"max_l1": max_l1, "mean_l1": mean_l1, "protected_accuracy": protected,
                "centroids": None if (cfg.victim.url or cfg.victim.serve) else centroid_count(defense),
                "cell_seconds": time.perf_counter() - t0})
    return out


def protected_accuracy(cell: Cell, prep: Prepared) -> float:
    """Victim test accuracy through a fresh instance of the cell's defense (answers' top-1 vs true labels)."""
    defense = cell_defense(cell.defense, cell.epsilon, prep, cell.seed)
    x, y = prep.eval_set.x, prep.eval_set.y
    clean = clean_fn(prep.victim)(x)
    ans = defense.defend(clean, x) if defense.needs_inputs else defense.defend(clean)
    return (ans.argmax(1) == y).float().mean().item()


def _remote_accuracy(victim: Any, prep: Prepared) -> float:
    ans = torch.cat([victim.query(prep.eval_set.x[i : i + 256]) for i in range(0, len(prep.eval_set.x), 256)])
    return (ans.argmax(1) == prep.eval_set.y).float().mean().item()


def _serve(cfg: ExtractionConfig, prep: Prepared, cell: Cell, workdir: Path) -> tuple[Any, Any]:
    """Start the guarded HTTP service on 127.0.0.1 for this cell's defense and connect an HTTP victim."""
    if cell.defense.name in ("mad", "adaptive_misinformation"):
        raise ConfigError("victim.serve: MAD and AdaptiveMisinformation need model files on the server; "
                          "evaluate them with a local victim (victim.serve = false)")
    key = "modelward-eval-" + hashlib.sha256(cell.run_id.encode()).hexdigest()[:16]
    folder = workdir / "serve" / hashlib.sha256(cell.run_id.encode()).hexdigest()[:12]
    path = write_guard_config(folder, fold_temperature(prep.victim), prep.model_cfg, prep.data.input_shape,
                              prep.data.num_classes, defense=cell.defense.name, defense_params=_serve_params(cell),
                              keys={key: None}, name=cfg.victim.model_name)
    server = start_guard_server(path)
    try:
        return server, HttpVictim(server.url, server.model_name, key)
    except BaseException:
        server.stop()
        raise


def _serve_params(cell: Cell) -> dict[str, Any]:
    params = dict(cell.defense.params)
    if cell.epsilon is not None:
        params["epsilon"] = cell.epsilon
    return params


_PREPARED: dict[str, Prepared] = {}


def execute_cell(cfg_json: str, out_dir: str, run_id: str, spec: dict[str, Any],
                 dep_results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One cell as a :func:`~modelward.core.runner.run_plan` run (the victim is prepared once per process)."""
    if cfg_json not in _PREPARED:
        _PREPARED[cfg_json] = prepare(ExtractionConfig.model_validate_json(cfg_json))
    return run_cell(ExtractionConfig.model_validate_json(cfg_json), _PREPARED[cfg_json], cell_from_spec(spec),
                    Path(out_dir))


class ExtractionStudy(Study[ExtractionConfig, dict[str, Any]]):
    """The extraction evaluation in the core frame: one run per cell (attack × defence × budget × seed)."""

    name = "extraction"
    config_model = ExtractionConfig
    fail_fast = True

    def __init__(self) -> None:
        self.prep: Prepared | None = None
        self.done_before = 0

    def legacy_fingerprints(self, cfg: ExtractionConfig) -> tuple[str, ...]:
        legacy = json.dumps(cfg.model_dump(mode="json", exclude={"threads", "device"}), sort_keys=True, default=str)
        return (hashlib.sha256(legacy.encode()).hexdigest()[:16],)

    @contextmanager
    def session(self, cfg: ExtractionConfig, ctx: StudyContext) -> Iterator[None]:
        with torch_threads(cfg.threads):
            ids = {c.run_id for c in cells(cfg)}
            self.done_before = sum(1 for r in ctx.ledger.results() if r in ids)
            cfg_json = cfg.model_dump_json()
            self.prep = _PREPARED[cfg_json] = prepare(cfg, ctx.progress)
            try:
                yield
            finally:
                _PREPARED.pop(cfg_json, None)

    def plan(self, cfg: ExtractionConfig, ctx: StudyContext) -> list[RunSpec]:
        return plan(cfg)

    def execute(self, cfg: ExtractionConfig, ctx: StudyContext) -> Execute:
        return partial(execute_cell, cfg.model_dump_json(), str(ctx.out))

    def on_result(self, cfg: ExtractionConfig, ctx: StudyContext) -> Callable[[str, dict[str, Any]], str]:
        return lambda rid, res: f"{rid}: acc {res['accuracy']:.3f}"

    def summarize(self, cfg: ExtractionConfig, ctx: StudyContext, outcome: RunOutcome) -> dict[str, Any]:
        assert self.prep is not None
        all_cells = cells(cfg)
        by_id = {c.run_id: c for c in all_cells}
        results = ctx.ledger.results()
        order = {c.run_id: i for i, c in enumerate(all_cells)}
        rows = [row(by_id[r], res) for r, res in sorted(results.items(), key=lambda kv: order.get(kv[0], -1))
                if r in by_id]
        curves = centroid_curves(cfg, self.prep) if cfg.centroid_epsilons else {}
        summary = write_report(cfg, rows, self.prep, curves, ctx.out)
        return {**summary, "victim_cached": self.prep.cached, "pool": len(self.prep.transfer),
                "already_done": self.done_before}


def run_evaluation(cfg: ExtractionConfig, out: str | Path, progress: ProgressSink | None = None, *,
                   workers: int = 1, executor: str = "local", address: str | None = None) -> dict[str, Any]:
    """Run every pending cell through the ledger and write the report files.

    Args:
        cfg: the evaluation.
        out: the run directory (``config.json``, ``ledger.sqlite``, the report files).
        progress: receives the victim's training (key ``"victim"``) and one unit per cell (key ``"extraction"``).
        workers, executor, address: where cells run (:func:`modelward.core.runner.run_plan`; ``"ray"`` for a
            cluster). Other processes prepare the victim once each, from the cached checkpoint.

    Returns:
        A summary: ``cells``, ``victim_accuracy``, ``victim_cached``, ``pool``, ``already_done``, ``worst_case``
        rows and the ``outputs`` written. A failing cell is recorded and its error re-raised (re-run to resume).

    Example:
        >>> from modelward.core.config import load_config
        >>> cfg = load_config("examples/extraction_digits.toml", ExtractionConfig)  # doctest: +SKIP
        >>> run_evaluation(cfg, "runs/extraction")["cells"]  # doctest: +SKIP
    """
    return run_study(ExtractionStudy(), cfg, out, workers=workers, executor=executor, address=address,
                     progress=progress)
