"""The guarded service's core, transport-free: authenticate a key, answer a batch (budget → model → defense as the
model's post-process → log), and own the defense state (``state_dir``: lock, fingerprint, snapshot, centroid log).

The defense runs server-side; only defended probabilities leave the process (never logits or clean probabilities).
A stateful defense (ModelGuard-S) is persisted to ``state_dir`` and reloaded on start.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from modelward.backdoor.detect.input.strip import StripMonitor
from modelward.core.io import load_tensors, save_tensors
from modelward.core.lock import FolderLock
from modelward.core.records import atomic_write_text
from modelward.core.seed import seeded
from modelward.core.text import load_tokenizer, token_embedding
from modelward.core.zoo import build_model
from modelward.errors import ConfigError, DataError
from modelward.extraction.defenses import IncrementalState, PredictionDefense, build_defense
from modelward.extraction.guard.backend import load_weights, open_model
from modelward.extraction.guard.config import (
    GuardConfig,
    KeySection,
    fingerprint_diff,
    load_guard_config,
    state_fingerprint,
)
from modelward.extraction.guard.errors import BudgetExceeded, GuardError, WouldBlock
from modelward.extraction.guard.oip import InferRequest, TextInput, encode_response, model_metadata
from modelward.extraction.guard.ownership import GuardOwnership
from modelward.extraction.guard.proxy import parsed
from modelward.extraction.guard.store import SQLStore, Transaction, key_digest, open_store

T = TypeVar("T")
log = logging.getLogger("modelward.guard")


@dataclass
class InferAnswer:
    """An encoded response body (JSON, or JSON header + binary tensor for the binary extension)."""

    body: bytes
    header_length: int | None  # Inference-Header-Content-Length when the binary extension is used
    rows: int
    max_l1: float


def text_input(cfg: GuardConfig, base_dir: Path, model: nn.Module) -> TextInput | None:
    """How a text model's requests arrive (``[model] input_datatype`` INT64 or BYTES), or None for FP32 inputs."""
    m = cfg.model
    if m.input_datatype == "FP32":
        return None
    try:
        vocab: int | None = token_embedding(model).num_embeddings
    except ConfigError:  # proxy mode: the model is behind a server; it checks its own ids
        vocab = None
    pad = m.pad_id if m.pad_id is not None else getattr(model, "pad_token_id", 0)
    if m.input_datatype == "INT64":
        return TextInput("INT64", pad, vocab)
    tok = load_tokenizer(base_dir / str(m.tokenizer))
    if tok.pad_token_id is not None and tok.pad_token_id != pad:
        raise ConfigError(f"model.tokenizer pads with id {tok.pad_token_id}, the model with {pad}")

    def tokenize(texts: list[str]) -> np.ndarray:
        enc = tok(texts, padding="longest", truncation=True, max_length=m.input_shape[0])
        return np.asarray(enc["input_ids"], dtype=np.int64).reshape(len(texts), -1)

    return TextInput("BYTES", pad, vocab, tokenize)


def service_defense(cfg: GuardConfig, base_dir: Path) -> PredictionDefense:
    """The configured defense, with the models MAD / AdaptiveMisinformation declare in ``needs``."""
    shape, k = tuple(cfg.model.input_shape), cfg.model.num_classes

    def surrogate() -> nn.Module:
        with seeded(cfg.defense.surrogate_seed):
            return build_model(cfg.model.net, shape, k)

    def misinformation() -> nn.Module:
        if not cfg.defense.misinformation_checkpoint:
            raise ConfigError("defense.misinformation_checkpoint: required for adaptive_misinformation "
                              "(a safetensors checkpoint of the misinformation model, same architecture)")
        mis = build_model(cfg.model.net, shape, k)
        load_weights(mis, base_dir / cfg.defense.misinformation_checkpoint, "defense.misinformation_checkpoint")
        return mis

    return build_defense(cfg.defense, {"surrogate": surrogate, "misinformation": misinformation})


class GuardService:
    """Model + defense + keys + log; :meth:`handle` answers one Open Inference Protocol inference request.

    Opening a service takes the ``state_dir`` lock (one server per state folder) and checks the folder's
    ``service.json`` — the defense settings its state was built with. Different settings are refused unless
    ``reset=True``, which discards the defense state (centroids) and records the new settings; the query log and
    the keys' usage are kept.

    Args:
        cfg: the validated config.
        base_dir: the folder relative paths in ``cfg`` are resolved against (the config file's).
        reset: start a new defense state when the settings differ.
        check_only: load and check without the lock, the state or the log (``guard check`` beside a server).

    Example:
        >>> svc = build_service("guard.toml")  # doctest: +SKIP
        >>> y_hat, max_l1 = svc.answer(svc.keys["my-key"], torch.rand(4, 1, 8, 8))  # doctest: +SKIP
    """

    def __init__(self, cfg: GuardConfig, base_dir: Path, reset: bool = False, check_only: bool = False) -> None:
        net = cfg.model.net
        if net.path and not Path(net.path).is_absolute():  # a Hugging Face folder, relative to the config file
            net = net.model_copy(update={"path": str(base_dir / net.path)})
            cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"net": net})})
        self.cfg = cfg
        self.name = cfg.model.name
        self.input_shape = tuple(cfg.model.input_shape)
        self.num_classes = cfg.model.num_classes
        # local weights, or the model server of proxy mode ([upstream]): the same nn.Module interface
        self.model, self.device = open_model(cfg, base_dir)
        self.text = text_input(cfg, base_dir, self.model)  # INT64 / BYTES inputs of a text model, else None
        self.defense = service_defense(cfg, base_dir)
        # issue 41: STRIP on every request's rows (None unless [strip] enabled); fitted on the operator's clean data
        self.strip = StripMonitor.from_section(cfg.strip, self.model, base_dir, self.input_shape)
        self.base_dir = base_dir
        self.state_dir = base_dir / cfg.server.state_dir
        self.state_path = self.state_dir / f"{self.name}.{self.defense.name}.state.safetensors"
        self.keys = {k.key: k for k in cfg.keys}
        self._stored: dict[str, KeySection] = {}  # sha256 of an operator-added key -> its section
        self._revoked: set[str] = set()  # names of revoked keys (config or operator)
        self._stop = threading.Event()
        self._spent: dict[str, int] = {}  # keys a request found spent: their usage is read before the next
        self._lock = threading.Lock()  # model and defense state change together
        self._closed = check_only  # check_only: no lock, no state, no log (``guard check`` beside a running server)
        self.ownership: GuardOwnership | None = None  # watermark + detector, opened with the state
        # ModelGuard-S: new centroids are appended to SQLite as they appear (a full snapshot costs ~60 ms at 10k
        # centroids); the safetensors snapshot is written on shutdown, and the rows after it are replayed on start
        self._incremental: IncrementalState | None = (
            self.defense if isinstance(self.defense, IncrementalState) else None)
        self._centroid_table = f"centroids_{self.name}_{self.defense.name}".replace("-", "_").replace(".", "_")
        self.changes = self.fingerprint_changes()
        if check_only:
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._folder_lock = FolderLock(self.state_dir, what="guard")
        self._folder_lock.__enter__()
        try:
            self.changes = self.fingerprint_changes()  # again: another server may have changed it meanwhile
            self._check_fingerprint(reset)
            s = cfg.server
            self.log: SQLStore = open_store(s.store_url, self.state_dir / s.query_log, busy_timeout=s.busy_timeout_s,
                                            retention_days=s.log_retention_days, max_rows=s.log_max_rows,
                                            detector_window=cfg.ownership.detector.window)
            try:
                if self.log.shared:  # replicas: the settings are pinned in the store, the state is its rows
                    reset = self._check_shared_fingerprint(reset)
                else:
                    self._load_snapshot()
                if self._incremental is not None:
                    if reset:
                        self.log.clear_centroids(self._centroid_table)
                    self._replay_centroids(self._incremental)
                self.refresh_keys()
                self.ownership = GuardOwnership(cfg.ownership, self.state_dir, self.num_classes, self.log)
            except BaseException:
                self.log.close()
                raise
        except BaseException:
            self._folder_lock.__exit__(None, None, None)
            raise

    # --------------------------------------------------------- state settings
    def fingerprint_changes(self) -> list[str]:
        """How this config's state settings differ from those ``state_dir`` was built with ([] if none/new)."""
        path = self.state_dir / "service.json"
        if not path.is_file():
            return []
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            old = {}
        return fingerprint_diff(old, state_fingerprint(self.cfg))

    def _check_shared_fingerprint(self, reset: bool) -> bool:
        """A shared store (replicas) records the state settings itself: a replica with other settings is refused
        (it would answer from another defense state), unless ``reset`` (stop every replica first). Returns whether
        the defense state must be reset."""
        mine = json.dumps(state_fingerprint(self.cfg), sort_keys=True)
        pinned = self.log.pin("state_fingerprint", mine)
        if pinned is None or pinned == mine:
            return False
        changes = fingerprint_diff(json.loads(pinned), state_fingerprint(self.cfg))
        if not reset:
            raise ConfigError(
                f"server.store_url {self.log.where}: its state was built with different settings "
                f"({'; '.join(changes)}). Replicas of one store must serve the same settings; restore them, or stop "
                "every replica and start one with --reset (discards the defense state, keeps the log and budgets)")
        self.log.set_meta("state_fingerprint", mine)
        return True

    def _check_fingerprint(self, reset: bool) -> None:
        path = self.state_dir / "service.json"
        if path.is_file():
            if self.changes and not reset:
                raise ConfigError(
                    f"server.state_dir {self.state_dir}: its state was built with different settings "
                    f"({'; '.join(self.changes)}). Serving it with these would silently reuse the old state; restore "
                    "the old settings, use another server.state_dir, or start a new state with --reset "
                    "(discards the defense state, keeps the query log and budgets)")
        elif not reset and any(self.state_dir.glob("*.state.safetensors")):
            raise ConfigError(f"server.state_dir {self.state_dir}: holds a defense state without service.json "
                              "(written by an older version); start a new state with --reset")
        if reset:
            for f in self.state_dir.glob("*.state.safetensors"):
                f.unlink()
        atomic_write_text(path, json.dumps(state_fingerprint(self.cfg), indent=2, sort_keys=True) + "\n")

    # --------------------------------------------------------- requests
    def metadata(self) -> dict[str, Any]:
        """The Open Inference Protocol model metadata."""
        return model_metadata(self.name, self.input_shape, self.num_classes, self.defense.name,
                              self.cfg.server.max_batch, self.cfg.model.input_datatype)

    def check_model(self, name: str, version: str | None) -> None:
        """GuardError ``unknown_model`` / ``unknown_version`` unless the request names this model (version 1)."""
        if name != self.name:
            raise GuardError("unknown_model", f"model {name!r} not found; this server serves {self.name!r}")
        if version is not None and version != "1":
            raise GuardError("unknown_version", f"model {name!r} has version '1' only, not {version!r}")

    def authenticate(self, authorization: str | None, api_key: str | None) -> KeySection:
        """The key named by ``Authorization: Bearer <key>`` (or ``X-API-Key``); GuardError ``unauthenticated``."""
        token = api_key
        if authorization:
            scheme, _, value = authorization.partition(" ")
            if scheme.lower() != "bearer" or not value:
                raise GuardError("unauthenticated", "Authorization header must be 'Bearer <api key>'")
            token = value.strip()
        if not token:
            raise GuardError("unauthenticated", "missing API key (send 'Authorization: Bearer <key>')")
        key = self.keys.get(token)
        if key is None:
            key = self._stored.get(key_digest(token))
        if key is None:
            raise GuardError("unauthenticated", "unknown API key")
        if key.name in self._revoked:
            raise GuardError("unauthenticated", f"API key {key.name!r} was revoked")
        return key

    def refresh_keys(self) -> None:
        """Read the keys operators added or revoked (``modelward guard keys``) from the store (off the event loop:
        :meth:`start_key_refresh` calls this every few seconds in a thread)."""
        stored, revoked = {}, set()
        for k in self.log.stored_keys():
            if k.revoked:
                revoked.add(k.name)
            if k.key_sha256 is not None:
                stored[k.key_sha256] = KeySection(name=k.name, key="(stored as sha256)", budget=k.budget)
        self._stored, self._revoked = stored, revoked  # swapped whole: readers see the old or the new sets

    def start_key_refresh(self, every: float = 2.0) -> None:
        """Refresh the operator keys every ``every`` seconds in a daemon thread until :meth:`close`; with SQLite,
        also checkpoint its WAL in a thread of its own (``SQLiteStore.start_checkpointer``)."""
        def loop() -> None:
            while not self._stop.wait(every):
                try:
                    self.refresh_keys()
                    self.log.maintain()  # retention, off the request path
                except Exception:  # noqa: BLE001 - a locked store: keep the last keys, try again
                    log.warning("guard: could not refresh the API keys from the store", exc_info=True)

        threading.Thread(target=loop, name="guard-keys", daemon=True).start()
        start_checkpointer = getattr(self.log, "start_checkpointer", None)  # SQLite: WAL checkpoints off the
        if start_checkpointer is not None:  # request path (a server; Python callers keep SQLite's automatic ones)
            start_checkpointer()

    def parse_request(self, body: bytes, header_length: str | None = None) -> InferRequest:
        """Parse one request body for this model (:meth:`InferRequest.parse`)."""
        req = parsed(body)  # proxy mode: the HTTP layer parsed this very body already
        return req if req is not None else InferRequest.parse(body, header_length, self.input_shape,
                                                              self.cfg.server.max_batch, self.text)

    def answer(self, key: KeySection, x: torch.Tensor, request_id: str | None = None,
               t0: float | None = None) -> tuple[torch.Tensor, float]:
        """Charge the key's budget and return the defended probabilities and their max ℓ1 distortion (Eq. 5).

        One transaction: the charge, the centroids the batch adds and the log row commit together, or — on any
        error (a full disk, a failing model) — none of them does, and the defense drops what the batch added in
        memory. BudgetExceeded comes before any work.

        Args:
            key: the authenticated key.
            x: the batch, ``[rows, *input_shape]``.
            request_id: logged with the row.
            t0: the request's ``time.perf_counter()`` start, for the logged latency (default: now).

        Returns:
            ``(y_hat, max_l1)``: B × K float32 probabilities and the largest ℓ1 distance from the clean ones.
        """
        return self._answer(key, x, request_id, t0, lambda y_hat, max_l1: (y_hat, max_l1))

    def handle(self, key: KeySection, body: bytes, header_length: str | None, request_id: str | None = None,
               t0: float | None = None, wait: bool = True) -> InferAnswer:
        """Parse, charge, defend, encode and log one request; the answer is encoded before the transaction commits,
        so a request that cannot be answered is never charged.

        Args:
            key, body, header_length: the authenticated key, the request body and its binary-extension header.
            request_id: logged with the row.
            t0: the request's ``time.perf_counter()`` start.
            wait: False: raise WouldBlock (nothing changed) instead of waiting for the model or the query log.

        Returns:
            The encoded answer. Any other exception carries ``rows`` (the request's row count) for the log.
        """
        req = self.parse_request(body, header_length)
        rows = int(req.x.shape[0])

        def encode(y_hat: torch.Tensor, max_l1: float) -> InferAnswer:
            payload, hl = encode_response(req, y_hat, self.name)
            return InferAnswer(payload, hl, rows, max_l1)

        try:
            return self._answer(key, req.x, request_id, t0, encode, wait)
        except (GuardError, WouldBlock):
            raise
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) and "busy" not in str(e):
                e.rows = rows  # type: ignore[attr-defined]
                raise
            raise GuardError("store_busy", f"the query log is locked by another process for more than "
                             f"{self.cfg.server.busy_timeout_s:g} s; nothing was charged; retry later", rows) from None
        except Exception as e:
            e.rows = rows  # type: ignore[attr-defined] - for the log row of the failed request
            raise

    @torch.no_grad()
    def _answer(self, key: KeySection, x: torch.Tensor, request_id: str | None, t0: float | None,
                finish: Callable[[torch.Tensor, float], T], wait: bool = True) -> T:
        t0 = time.perf_counter() if t0 is None else t0
        n = int(x.shape[0])
        inc = self._incremental
        own = self.ownership
        self._refuse_if_spent(key, n, wait)  # O(1): a key known spent never waits for the model or the store
        if own is not None:
            own.before(key.name)  # a key the detector flagged under action = "refuse": nothing is charged
        if not self._lock.acquire(blocking=wait):
            raise WouldBlock
        try:
            if self._closed:  # shut down while this request waited (its thread outlived the cancelled task)
                raise GuardError("shutting_down", "the server is shutting down; nothing was charged; retry")
            if self.strip is not None and bool(self.strip.check(key.name, self.model, x).any()) \
                    and self.strip.action == "refuse":  # issue 41: refused before any charge
                raise GuardError("backdoor_trigger_suspected", "an input of this request looks like it carries a "
                                 "backdoor trigger (STRIP); it was not answered and nothing was charged")
            before = inc.num_centroids if inc is not None else 0
            snapshot = self.defense.state_dict() if inc is None and self.defense.stateful else None
            pending = None  # the detector's judgement of this batch, applied only once the transaction committed
            try:
                with self.log.transaction(wait) as txn:  # COMMIT when the block ends; ROLLBACK if anything raises
                    self._charge(txn, key, n)  # BudgetExceeded before any work when the budget is spent
                    before = self._sync_shared_state(txn, key, before)
                    # the model runs on its device; the defense (its post-process) works on CPU probabilities
                    probs = torch.softmax(self.model(x.to(self.device)).float(), dim=1).cpu()
                    y_hat = self.defense.defend(probs, x) if self.defense.needs_inputs else self.defense.defend(probs)
                    if own is not None:  # watermark + detector rows join this transaction
                        y_hat, pending = own.after(txn, key.name, x, probs, y_hat)
                    max_l1 = float(np.abs(y_hat.numpy().astype(np.float64) - probs.numpy()).sum(1).max())
                    if inc is not None and inc.num_centroids != before:
                        labels, vecs = inc.centroids_since(before)
                        txn.append_centroids(self._centroid_table, before, labels, vecs)
                    elif snapshot is not None:
                        self.save_state()
                    out = finish(y_hat.float(), max_l1)
                    txn.log(key.name, n, 200, "ok", max_l1, (time.perf_counter() - t0) * 1e3, request_id)
            except BaseException:  # nothing was committed: memory goes back to what the store holds, in O(1):
                # the detector's update is dropped (never applied), the defense drops the centroids it added
                if inc is not None:
                    inc.truncate_centroids(before)
                elif snapshot is not None:
                    self.defense.load_state_dict(snapshot)
                raise
            if own is not None:
                own.commit(pending)
        finally:
            self._lock.release()
        return out

    def _refuse_if_spent(self, key: KeySection, n: int, wait: bool) -> None:
        """A key a request found spent: its usage is read again (one indexed read, no lock of the model or of the
        store's writer; an operator may have reset it) and, still spent, refused at once — a client retrying a spent
        key costs O(1) and never queues behind the others."""
        if key.budget is None or key.name not in self._spent:
            return
        used = self.log.used(key.name) if wait else self.log.used_nowait(key.name)
        if used is None:
            raise WouldBlock
        if used + n > key.budget:
            raise BudgetExceeded(key.name, used, key.budget, n)
        self._spent.pop(key.name, None)

    def _charge(self, txn: Transaction, key: KeySection, n: int) -> None:
        try:
            txn.charge(key.name, n, key.budget)
        except BudgetExceeded as e:
            self._spent[key.name] = e.used
            raise

    def _sync_shared_state(self, txn: Transaction, key: KeySection, before: int) -> int:
        """Inside the request's transaction, before the model: the centroids other replicas added (a shared store;
        in order) and the key's detector state (a refused key stops here). Returns the centroid count to undo to."""
        inc = self._incremental
        if inc is not None:
            labels, vecs = txn.sync_centroids(self._centroid_table, inc.num_centroids, self.num_classes)
            if len(labels):
                inc.extend_centroids(labels, vecs)
            before = inc.num_centroids
        if self.ownership is not None:
            self.ownership.begin(txn, key.name)
        return before

    # --------------------------------------------------------- state
    def _load_snapshot(self) -> None:
        """Load the shutdown snapshot of a stateful defense; a damaged one (a crash while it was written) is set
        aside as ``*.damaged`` with a warning: an incremental defense is rebuilt from its rows in the store."""
        if not (self.defense.stateful and self.state_path.is_file()):
            return
        try:
            self.defense.load_state_dict(load_tensors(self.state_path))
        except DataError as e:
            aside = self.state_path.with_name(self.state_path.name + ".damaged")
            self.state_path.replace(aside)
            self.defense = service_defense(self.cfg, self.base_dir)  # empty again, whatever the load left
            self._incremental = self.defense if isinstance(self.defense, IncrementalState) else None
            log.warning("guard: the defense snapshot %s is damaged (%s); moved to %s, %s", self.state_path, e, aside,
                        "rebuilding it from the centroid rows" if self._incremental is not None
                        else "starting with an empty defense state")

    def _replay_centroids(self, inc: IncrementalState) -> None:
        """Bring memory and the store's centroid rows to the same sequence (the rows are the record; the snapshot
        only saves replaying them). A snapshot longer than the rows (written by an older version whose appends
        failed) is written back to the store, so the next append continues a gap-free sequence."""
        n = inc.num_centroids
        labels, vecs = self.log.centroids_from(self._centroid_table, 0, self.num_classes)
        if len(labels) >= n:
            inc.extend_centroids(labels[n:], vecs[n:])
        else:
            log.warning("guard: %s holds %d centroids, the store %d; writing the snapshot's back to the store",
                        self.state_path, n, len(labels))
            self.log.rewrite_centroids(self._centroid_table, *inc.centroids_since(0))

    def save_state(self) -> None:
        """Snapshot a stateful defense to ``state_path`` (safetensors, with the defense's name and parameters)."""
        if self.defense.stateful:
            save_tensors(self.state_path, self.defense.state_dict(), {"defense": self.defense.name,
                                                                      "params": json.dumps(self.defense.params())})

    def status(self) -> dict[str, Any]:
        """The operator's view: the detector's verdict per key and the watermark's state (no secrets)."""
        own = self.ownership
        strip = {"strip": self.strip.status()} if self.strip is not None else {}  # issue 41
        if own is None:
            return {"detector": None, "watermark": None, **strip}
        det = own.cfg.detector
        wm = own.cfg.watermark
        marked = own.marked_rows() if wm.enabled else 0
        return {
            "detector": {"enabled": det.enabled, "action": det.action, "delta": det.delta,
                         "keys": [vars(k) for k in own.status()]} if det.enabled else None,
            "watermark": {"enabled": wm.enabled, "fraction": wm.fraction,
                          "marked_rows": marked} if wm.enabled else None,
            **strip,
        }

    def close(self) -> None:
        """Save the defense state, close the log and release the ``state_dir`` lock (idempotent).

        A snapshot that cannot be written (a full disk) is logged, not raised: for ModelGuard-S the centroid rows
        in the store hold every centroid, and the next start replays them.
        """
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        try:
            with self._lock:
                try:
                    self.save_state()
                except Exception as e:  # noqa: BLE001 - a shutdown must finish; say what was lost
                    self.state_path.with_name(self.state_path.name + ".tmp").unlink(missing_ok=True)
                    log.error("guard: could not write the defense snapshot %s (%s); %s", self.state_path, e,
                              "the centroid rows in the store hold every centroid: nothing is lost"
                              if self._incremental is not None else "the state since the last snapshot is lost")
                self.log.close()  # under the model lock: a request still waiting for it finds the service closed
        finally:
            self._folder_lock.__exit__(None, None, None)


def build_service(config_path: str | Path, overrides: list[str] | None = None, reset: bool = False,
                  check_only: bool = False) -> GuardService:
    """Load ``config_path`` (relative paths resolved against its folder) and open its :class:`GuardService`."""
    path = Path(config_path)
    cfg = load_guard_config(path, overrides)
    return GuardService(cfg, path.resolve().parent, reset=reset, check_only=check_only)
