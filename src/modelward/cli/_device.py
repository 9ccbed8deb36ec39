"""The ``--device`` option shared by the commands that run training, evaluation, attack, defense, certification
or RL loops (docs/devices.md): ``--device X`` is ``--set device=X``, and an unusable device is refused with a
ConfigError before any work starts."""

from __future__ import annotations

from typing import Annotated

import typer

DEVICE_HELP = "auto | cpu | cuda | cuda:N | mps (default: the config's device, else cpu)"
DeviceOption = Annotated[str | None, typer.Option("--device", help=DEVICE_HELP)]


def with_device(overrides: list[str] | None, device: str | None, key: str = "device") -> list[str]:
    """The ``--set`` overrides plus ``key=device`` when ``--device`` was given (it wins over the file)."""
    out = list(overrides or [])
    if device is not None:
        out.append(f"{key}={device}")
    return out


def require_device(spec: str) -> str:
    """Refuse a device this machine does not have (ConfigError naming the choices) before any work starts;
    returns the spec unchanged ("auto" is resolved again where the work runs, e.g. on a cluster worker)."""
    # lazy: core.device imports torch; the commands' --help must not
    from modelward.core.device import resolve_device

    resolve_device(spec)
    return spec
