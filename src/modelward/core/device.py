"""Choosing the device a computation runs on (the written policy is docs/devices.md).

Example:
    >>> resolve_device("cpu")
    device(type='cpu')
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Annotated, Literal

import torch
from pydantic import AfterValidator

from modelward.core.modules import model_device  # re-exported: callers import it from here too
from modelward.errors import ConfigError

__all__ = ["AmpSetting", "DeviceSetting", "autocast", "check_device_spec", "model_device", "resolve_device"]

VALID = '"auto", "cpu", "cuda", "cuda:N", "mps"'


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def resolve_device(spec: str | torch.device = "cpu") -> torch.device:
    """The ``torch.device`` for a device setting.

    Args:
        spec: ``"auto"`` (the first CUDA GPU if there is one, else Apple ``mps``, else ``cpu``), ``"cpu"``,
            ``"cuda"`` (the current CUDA device), ``"cuda:N"``, ``"mps"``, or a ``torch.device``.

    Returns:
        The device.

    Raises:
        ConfigError: an unknown spec, or a device this machine does not have (the message names what exists).
    """
    if isinstance(spec, torch.device):
        spec = str(spec)
    if not isinstance(spec, str):
        raise ConfigError(f"device: expected one of {VALID}, got {spec!r}")
    s = spec.strip().lower()
    n_cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if s == "auto":
        if n_cuda:
            return torch.device("cuda", 0)
        return torch.device("mps") if _mps_available() else torch.device("cpu")
    if s == "cpu":
        return torch.device("cpu")
    if s == "mps":
        if not _mps_available():
            raise ConfigError("device='mps': Apple MPS is not available on this machine; use 'auto' or 'cpu'")
        return torch.device("mps")
    m = re.fullmatch(r"cuda(?::(\d+))?", s)
    if m:
        if not n_cuda:
            raise ConfigError(f"device={spec!r}: no CUDA GPU is available (torch {torch.__version__}); "
                              "use 'auto' or 'cpu'")
        idx = torch.cuda.current_device() if m.group(1) is None else int(m.group(1))
        if idx >= n_cuda:
            raise ConfigError(f"device={spec!r}: this machine has {n_cuda} CUDA device(s): "
                              f"{[f'cuda:{i}' for i in range(n_cuda)]}")
        return torch.device("cuda", idx)
    raise ConfigError(f"device={spec!r}: valid choices: {VALID}")


def check_device_spec(spec: str) -> str:
    """The syntax of a device setting (not whether this machine has it: a config written on a laptop may name
    the cluster's ``cuda``); :func:`resolve_device` checks availability where the work starts."""
    s = str(spec).strip().lower()
    if s in ("auto", "cpu", "mps") or re.fullmatch(r"cuda(?::\d+)?", s):
        return s
    raise ValueError(f"device={spec!r}: valid choices: {VALID}")


# a config field: ``device: DeviceSetting = "cpu"`` (validated when the config loads, resolved when work starts)
DeviceSetting = Annotated[str, AfterValidator(check_device_spec)]

# mixed precision of training loops: "bf16" runs forward passes and losses under torch.autocast(bfloat16)
AmpSetting = Literal["none", "bf16"]


@contextlib.contextmanager
def autocast(device: torch.device | str, amp: str = "none") -> Iterator[None]:
    """``torch.autocast`` in bfloat16 on `device` when ``amp == "bf16"``, else nothing (full precision).

    bfloat16 keeps float32's exponent range, so no loss scaling is needed. Used around the forward pass and
    loss of training loops only; certification, Lipschitz bounds and evaluation run in full precision
    (docs/devices.md §5).
    """
    if amp == "none":
        yield
        return
    if amp != "bf16":
        raise ConfigError(f"amp={amp!r}: valid choices: 'none', 'bf16'")
    dev = torch.device(device)
    with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
        yield
