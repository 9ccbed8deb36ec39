"""A party's durable state: what a checkpoint holds, saving it, and restoring it (parameters, buffers, optimizer,
the integrity statistics).

A checkpoint of step m is the state step m starts from: the live state, or (a pipelined session, where step m may
be applied already when the commit of step m-1 arrives) the snapshot of the prepared step m
(:func:`~modelward.governance.party.pipeline.prepared_state`), or the live parameters with the buffers of an
earlier moment (a commit held during the next step's forward pass, which moved them). The checkpoint writer waits
for the audit log's sync first, so no saved state rests on a record a power cut could take away.

Example:
    >>> state = PartyState("bob", ["fc1"], segment, tentative, integrity, Checkpoints(folder, 3), audit)  # doctest: +SKIP
    >>> state.save(10, background=True)  # doctest: +SKIP
    >>> state.restore(10)  # doctest: +SKIP
    10
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from modelward.core.io import load_into, optimizer_from_tensors, optimizer_to_tensors, save_tensors
from modelward.core.train import TrainConfig, make_optimizer
from modelward.governance.audit import AuditLog
from modelward.governance.integrity import StepIntegrity
from modelward.governance.party.checkpoints import Checkpoints, state_digest
from modelward.governance.party.pipeline import prepared_state
from modelward.governance.party.step import Prepared, TentativeStep
from modelward.governance.protocol import PartyError


class PartyState:
    """Checkpoint tensors, save and restore for one party.

    Args:
        name: the party's name; layers: the layers it holds (both in the checkpoint's metadata).
        segment: its segment; tentative: its tentative step (optimizer, training configuration, rollback buffers).
        integrity: its integrity statistics (saved with the state, restored with it).
        ckpt: its checkpoint folder; audit: its audit log (synced before a checkpoint is written).
    """

    def __init__(self, name: str, layers: list[str], segment: torch.nn.Module, tentative: TentativeStep,
                 integrity: StepIntegrity, ckpt: Checkpoints, audit: AuditLog) -> None:
        self.name, self.layers, self.segment, self.tentative = name, layers, segment, tentative
        self.integrity, self.ckpt, self.audit = integrity, ckpt, audit
        self.params = dict(segment.named_parameters())

    def tensors(self, step: int, buffers: dict[str, torch.Tensor] | None = None, snap: Prepared | None = None
                ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """A checkpoint's tensors and metadata: of the live state at committed step `step` (`buffers`: the buffers
        of an earlier moment), or of the state the prepared step `snap` starts from."""
        t = self.tentative
        at = step if snap is None else snap.step
        meta: dict[str, Any] = {"step": at, "party": self.name, "layers": self.layers,
                                "integrity": self.integrity.state(at)}
        if snap is not None:
            assert t.train_cfg is not None
            tensors, meta["opt"] = prepared_state(snap, list(self.params), t.train_cfg)
            meta["train_cfg"] = t.train_cfg.model_dump(mode="json")
            return tensors, meta
        tensors = {f"model.{k}": v for k, v in self.segment.state_dict().items()}
        if buffers is not None:
            tensors.update({f"model.{k}": buffers[k] for k in t.buffer_keys})
        if t.opt is not None and t.train_cfg is not None:
            ot, skel = optimizer_to_tensors(t.opt)
            tensors.update(ot)
            meta["opt"] = skel
            meta["train_cfg"] = t.train_cfg.model_dump(mode="json")
        return tensors, meta

    def save(self, step: int, background: bool = False, buffers: dict[str, torch.Tensor] | None = None,
             snap: Prepared | None = None) -> Path:
        """Write the checkpoint of committed step `step` (or of the prepared step `snap`); returns its path."""
        # the records of every step in this checkpoint are on stable storage before it is (a step's own record may
        # still be syncing in the background when the step commits): the writer waits for the log's sync first
        tensors, meta = self.tensors(step, buffers, snap)
        return self.ckpt.save(step if snap is None else snap.step, tensors, meta, background, before=self.audit.sync)

    def export(self, step: int) -> Path:
        """Write export.safetensors (parameters and buffers only) into the party's own checkpoint folder; returns
        its path (nothing but the path leaves the party)."""
        path = self.ckpt.dir / "export.safetensors"
        save_tensors(path, self.segment.state_dict(), {"modelward": json.dumps({"step": step, "party": self.name})})
        return path

    def restore(self, step: int) -> int:
        """Load the checkpoint of step `step` (the prepared step, if any, is forgotten); returns its step."""
        got = self.ckpt.load(step)
        if got is None:
            raise PartyError(f"party {self.name} has no checkpoint at step {step} (has {self.ckpt.list()})")
        tensors, meta = got
        t = self.tentative
        load_into(self.segment, {k[6:]: v for k, v in tensors.items() if k.startswith("model.")},
                  f"party {self.name} checkpoint at step {step}")
        t.prepared = None
        t.rolled_back = None
        if isinstance(meta.get("integrity"), dict):
            self.integrity.load_state(meta["integrity"])
        if "train_cfg" in meta:
            t.train_cfg = TrainConfig.model_validate(meta["train_cfg"])
            t.opt = make_optimizer(list(self.params.values()), t.train_cfg)
            optimizer_from_tensors(t.opt, {k: v for k, v in tensors.items() if k.startswith("opt.")}, meta["opt"])
        elif t.opt is not None and t.train_cfg is not None:
            t.opt = make_optimizer(list(self.params.values()), t.train_cfg)  # fresh state, as at step 0
        return int(meta["step"])

    def digest(self, step: int) -> str:
        """sha256 over parameters, buffers and optimizer state: equal digests = bit-identical state."""
        return state_digest(self.tensors(step)[0])
