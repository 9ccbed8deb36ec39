"""A party's checkpoints: parameters, buffers and optimizer state per step, written atomically, pruned.

Files are ``step_<8 digits>.safetensors`` in the party's own folder (never unpickled). A background write snapshots
(copies) the tensors first, so training goes on while a thread writes a temp file and renames it: a checkpoint
appears atomically or not at all, and a crash during the write only loses that checkpoint. Step 0 is always kept,
plus the last ``keep`` checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch

from modelward.core.io import load_metadata, load_tensors, save_tensors, write_safetensors
from modelward.core.threads import torch_thread_pool

CKPT_RE = re.compile(r"^step_(\d{8})\.safetensors$")


def state_digest(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over named tensors (name, dtype, bytes): equal digests = bit-identical state."""
    h = hashlib.sha256()
    for k in sorted(tensors):
        t = tensors[k].detach().contiguous().cpu()
        h.update(k.encode())
        h.update(str(t.dtype).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class Checkpoints:
    """The checkpoint folder of one party.

    Args:
        folder: the party's checkpoint_dir (created).
        keep: how many of the latest checkpoints to keep (step 0 is kept in addition).
    Example:
        >>> ck = Checkpoints("runs/bob/checkpoints", keep=3)  # doctest: +SKIP
        >>> ck.save(5, {"model.w": w}, {"step": 5}, background=True); ck.list()  # doctest: +SKIP
        [0, 5]
    """

    def __init__(self, folder: str | Path, keep: int) -> None:
        self.dir = Path(folder)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        # one long-lived writer: starting a thread per checkpoint costs the step that commits (its start-up
        # contends for the GIL with it; figures in docs/benchmarks/governance.md)
        self._writer = torch_thread_pool(1, f"checkpoints-{self.dir.name}")
        self._pending: Future[None] | None = None
        self._error: str | None = None
        # a step whose latest checkpoint at or before it is never pruned (the party's last good state, integrity)
        self.pinned: Callable[[], int | None] | None = None

    def path(self, step: int) -> Path:
        return self.dir / f"step_{step:08d}.safetensors"

    def list(self) -> list[int]:
        """Steps with a complete checkpoint (waits for a background write in flight)."""
        self.join()
        return self._list()

    def _list(self) -> list[int]:
        return sorted(int(m.group(1)) for p in self.dir.glob("step_*.safetensors") if (m := CKPT_RE.match(p.name)))

    def save(self, step: int, tensors: dict[str, torch.Tensor], meta: dict[str, Any], background: bool = False,
             before: Callable[[], None] | None = None) -> Path:
        """Write the checkpoint of `step` (in the background: the tensors are copied first). `before` runs just
        before the file is written, on the writing thread (what must be durable before the checkpoint is)."""
        self.join()
        path = self.path(step)
        md = {"modelward": json.dumps(meta)}
        if not background:
            if before is not None:
                before()
            save_tensors(path, tensors, md)
            self._prune()
            return path
        snap = {k: v.detach().clone(memory_format=torch.contiguous_format) for k, v in tensors.items()}
        self._pending = self._writer.submit(self._write, path, snap, md, before)
        return path

    def _write(self, path: Path, snap: dict[str, torch.Tensor], md: dict[str, str],
               before: Callable[[], None] | None) -> None:
        tmp = path.with_name(path.name + ".tmp")
        try:
            if before is not None:
                before()
            write_safetensors(tmp, snap, md)  # the GIL stays free for the party's step meanwhile
            os.replace(tmp, path)
            self._prune()
        except Exception as e:  # surfaced to the next request (before it computes anything)
            self._error = f"checkpoint {path.name} could not be written: {type(e).__name__}: {e}"

    def join(self) -> None:
        f = self._pending
        if f is not None:
            f.result()  # _write reports its own failure through take_error()
            self._pending = None

    def close(self) -> None:
        """Wait for the write in flight and stop the writer."""
        self.join()
        self._writer.shutdown()

    def take_error(self) -> str | None:
        err, self._error = self._error, None
        return err

    def _prune(self) -> None:
        steps = self._list()
        pin = self.pinned() if self.pinned is not None else None
        keep = max((s for s in steps if s <= pin), default=None) if pin is not None else None
        for old in steps[: -self.keep]:
            if old != 0 and old != keep:  # step 0 stays: a full restart is always possible
                self.path(old).unlink(missing_ok=True)

    def load(self, step: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
        self.join()
        path = self.path(step)
        if not path.is_file():
            return None
        return load_tensors(path), json.loads(load_metadata(path).get("modelward", "{}"))
