"""Choosing the device a computation runs on (the written policy is docs/devices.md).

Example:
    >>> resolve_device("cpu")
    device(type='cpu')
"""

from __future__ import annotations

import re

import torch

from modelward.errors import ConfigError

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
