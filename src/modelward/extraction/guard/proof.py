"""The owner's two ownership jobs for a guard: make its boundary fingerprint (``guard fingerprint``) and test a
suspect model against the guard's watermark records and fingerprint (``guard verify``).

Both read the guard's config and ``state_dir`` and never touch a running server's state: the watermark records
are read from ``ownership.sqlite`` read-only, the fingerprint is written atomically beside them.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from modelward.core.progress import ProgressSink, as_sink
from modelward.core.train import fit_from_config
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError, DataError
from modelward.extraction.guard.config import GuardConfig, load_guard_config
from modelward.extraction.guard.ownership import read_marks
from modelward.extraction.guard.service import load_weights
from modelward.extraction.guard.store import open_store
from modelward.extraction.ownership.fingerprint import Fingerprint, make_fingerprint, random_seeds
from modelward.extraction.ownership.verify import (
    HttpSuspect,
    LocalSuspect,
    OwnershipReport,
    Suspect,
    verify_ownership,
)


def _owner(cfg: GuardConfig, base: Path) -> nn.Module:
    if cfg.model.checkpoint is None:  # proxy mode: the weights stay with the model server
        raise ConfigError("model.checkpoint: the fingerprint is made from the served model's weights, and this guard "
                          "is in proxy mode ([upstream]): run `guard fingerprint` on a config naming the checkpoint "
                          "the model server serves (the answer watermark and the detector work in proxy mode)")
    model = build_model(cfg.model.net, tuple(cfg.model.input_shape), cfg.model.num_classes)
    load_weights(model, base / cfg.model.checkpoint, "model.checkpoint")
    return model.eval()


def make_guard_fingerprint(config_path: str | Path, overrides: list[str] | None = None,
                           progress: ProgressSink | None = None) -> tuple[Path, Fingerprint]:
    """Train the reference models, make the fingerprint and store it in the guard's ``state_dir``.

    Args:
        config_path: the GUARD.toml; ``[ownership.fingerprint]`` names the data and the training recipe.
        overrides: ``--set`` strings.
        progress: a progress sink (one step per reference model).

    Returns:
        (the fingerprint file, the fingerprint).

    Example:
        >>> path, fp = make_guard_fingerprint("guard.toml")  # doctest: +SKIP
    """
    path = Path(config_path)
    cfg = load_guard_config(path, overrides)
    fcfg = cfg.ownership.fingerprint
    if fcfg.data is None:
        raise ConfigError("ownership.fingerprint.data: required to make a fingerprint (the owner's data, e.g. "
                          "{ source = \"digits\" }); the reference models are trained on it")
    base = path.resolve().parent
    owner = _owner(cfg, base)
    sink = as_sink(progress)
    n_refs = fcfg.selection_references + fcfg.calibration_references
    sink.start("fingerprint", n_refs, "training reference models")
    refs: list[nn.Module] = []
    data = None
    for i in range(n_refs):
        m, _, data = fit_from_config(fcfg.data, cfg.model.net, fcfg.train, seed=fcfg.reference_seed + i)
        refs.append(m.eval().cpu())
        sink.advance("fingerprint", 1, f"reference {i + 1}/{n_refs}")
    assert data is not None
    if tuple(data.input_shape) != tuple(cfg.model.input_shape) or data.num_classes != cfg.model.num_classes:
        raise ConfigError(f"ownership.fingerprint.data: gives inputs {list(data.input_shape)} and "
                          f"{data.num_classes} classes; the model takes {cfg.model.input_shape} and "
                          f"{cfg.model.num_classes}")
    x_train = data.x_train if torch.is_tensor(data.x_train) else torch.as_tensor(data.x_train)
    seeds = random_seeds(x_train, fcfg.candidates, seed=fcfg.reference_seed)
    lo, hi = float(x_train.min()), float(x_train.max())
    fp = make_fingerprint(owner, seeds, refs[: fcfg.selection_references], refs[fcfg.selection_references:],
                          n_points=fcfg.points, kappa=fcfg.kappa, clip=(lo, hi))
    out = base / cfg.server.state_dir / fcfg.file
    fp.save(out)
    sink.done("fingerprint", f"{len(fp)} points; references agree {min(fp.reference_agreement):.2f}–"
                             f"{max(fp.reference_agreement):.2f}")
    return out, fp


def open_suspect(suspect: str, cfg: GuardConfig, base: Path, *, model_name: str | None = None,
                 api_key: str | None = None, net: ModelConfig | None = None, labels_only: bool = False) -> Suspect:
    """A suspect from a string: an ``http(s)://`` OIP endpoint (``…/v2/models/NAME`` or a base URL with
    ``model_name``), or a local safetensors checkpoint of ``net`` (default: the guarded architecture)."""
    if suspect.startswith(("http://", "https://")):
        url, _, tail = suspect.partition("/v2/models/")
        name = (tail.split("/")[0] if tail else None) or model_name
        if not name:
            raise ConfigError(f"--suspect {suspect}: name the model (…/v2/models/NAME or --suspect-model NAME)")
        return HttpSuspect(url, name, api_key)
    path = Path(suspect)
    if not path.is_file():
        raise DataError(f"--suspect {suspect}: no such checkpoint (tried {path.resolve()}); give a safetensors "
                        "file or an http(s):// Open Inference Protocol URL")
    model = build_model(net or cfg.model.net, tuple(cfg.model.input_shape), cfg.model.num_classes)
    load_weights(model, path, "--suspect")
    return LocalSuspect(model, labels_only=labels_only)


def verify_suspect(config_path: str | Path, suspect: str | Suspect, *, overrides: list[str] | None = None,
                   level: float = 1e-6, max_watermark_rows: int | None = None, model_name: str | None = None,
                   api_key: str | None = None, labels_only: bool = False) -> OwnershipReport:
    """Test ``suspect`` against the guard's watermark records and its fingerprint (those that exist).

    Args:
        config_path: the GUARD.toml of the guard whose answers may have been stolen.
        suspect: a URL, a checkpoint path (see :func:`open_suspect`) or a :class:`Suspect`.
        overrides: ``--set`` strings.
        level: the decision level for "derived" (Bonferroni over the tests run).
        max_watermark_rows: cap on the watermark rows queried.
        model_name, api_key: for an HTTP suspect.
        labels_only: use only the suspect's labels (a local checkpoint).

    Returns:
        An :class:`~modelward.extraction.ownership.verify.OwnershipReport`.
    """
    path = Path(config_path)
    cfg = load_guard_config(path, overrides)
    base = path.resolve().parent
    state = base / cfg.server.state_dir
    sus = suspect if not isinstance(suspect, str) else open_suspect(suspect, cfg, base, model_name=model_name,
                                                                     api_key=api_key, labels_only=labels_only)
    marks = None
    store = state / cfg.server.query_log
    if cfg.ownership.watermark.enabled and cfg.server.store_url:  # replicas: the marks are in PostgreSQL
        shared = open_store(cfg.server.store_url, store)
        try:
            marks = read_marks(shared, cfg.model.num_classes)
        finally:
            shared.close()
        marks = marks if len(marks) else None
    elif cfg.ownership.watermark.enabled and store.is_file():
        marks = read_marks(store, cfg.model.num_classes)
        marks = marks if len(marks) else None
    fp_path = state / cfg.ownership.fingerprint.file
    fp = Fingerprint.load(fp_path) if fp_path.is_file() else None
    if marks is None and fp is None:
        raise DataError(f"{state}: nothing to verify against: no watermark records (serve with "
                        "[ownership.watermark] enabled) and no fingerprint (run `modelward guard fingerprint`)")
    try:
        return verify_ownership(sus, watermark=marks, fingerprint=fp, level=level,
                                max_watermark_rows=max_watermark_rows)
    finally:
        close = getattr(sus, "close", None)
        if callable(close):
            close()
