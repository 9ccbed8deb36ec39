"""Helpers to run the guarded service in a subprocess (tests, benchmarks, the demo) and to write its config."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from torch import nn

from modelward.core.config import read_toml, to_toml
from modelward.core.io import save_state_dict
from modelward.core.process import stop_gracefully
from modelward.core.zoo import ModelConfig
from modelward.errors import ModelwardError


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class GuardServerProcess:
    """A ``modelward guard serve`` subprocess on 127.0.0.1; ``.url``, ``.model_name``, ``.stop()``."""

    def __init__(self, proc: subprocess.Popen, url: str, model_name: str, log_path: Path) -> None:
        self.proc, self.url, self.model_name, self.log_path = proc, url, model_name, log_path

    def stop(self, timeout: float = 15.0) -> int:
        """Graceful stop (SIGTERM: the server saves the defense state), then kill after ``timeout`` s."""
        return stop_gracefully(self.proc, timeout)

    def __enter__(self) -> GuardServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_guard_server(config_path: str | Path, port: int | None = None, timeout: float = 60.0,
                       overrides: list[str] | None = None, reset: bool = False) -> GuardServerProcess:
    """Start ``python -m modelward.cli.main guard serve CONFIG`` on 127.0.0.1 and wait until it is ready."""
    import httpx

    config_path = Path(config_path)
    name = read_toml(config_path).get("model", {}).get("name", "model")
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = config_path.parent / f"guard-server-{port}.log"
    cmd = [sys.executable, "-m", "modelward.cli.main", "guard", "serve", str(config_path),
           "--host", "127.0.0.1", "--port", str(port)]
    for o in overrides or []:
        cmd += ["--set", o]
    if reset:
        cmd.append("--reset")
    log = open(log_path, "wb")  # noqa: SIM115 - owned by the child for its lifetime
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    log.close()
    server = GuardServerProcess(proc, url, name, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ModelwardError(f"guard server exited with code {proc.returncode}: "
                                 f"{log_path.read_text(errors='replace')[-2000:]}")
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=1.0).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    server.stop()
    raise ModelwardError(f"guard server did not become ready within {timeout:.0f} s (log: {log_path})")


def write_guard_config(directory: str | Path, model: nn.Module, model_cfg: ModelConfig,
                       input_shape: tuple[int, ...] | list[int], num_classes: int,
                       defense: str = "modelguard_s", defense_params: dict[str, Any] | None = None,
                       keys: dict[str, int | None] | None = None, name: str = "model",
                       server: dict[str, Any] | None = None, ownership: dict[str, Any] | None = None,
                       operators: set[str] | None = None) -> Path:
    """Save ``model`` as a safetensors checkpoint in ``directory`` and write a GUARD.toml serving it.

    ``keys`` maps API key -> query budget (None = unlimited); key names are ``key0, key1, ...``; keys in
    ``operators`` may read ``/v2/guard/status``. ``ownership`` is the ``[ownership]`` table; when it is None the
    watermark and the detector are written *off*, so the answers are exactly the defense's (studies and the
    demo measure a defense alone; a hand-written GUARD.toml gets both on by default).
    Returns the path of the written ``guard.toml``.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_state_dict(directory / "model.safetensors", model.state_dict(), {"arch": model_cfg.model_dump()})
    keys = keys or {"modelward-demo-key": None}
    config = {
        "server": {"host": "127.0.0.1", **(server or {})},
        "model": {"name": name, "checkpoint": "model.safetensors", "input_shape": list(input_shape),
                  "num_classes": int(num_classes), "net": model_cfg.model_dump(exclude_none=True)},
        "defense": {"name": defense, "params": dict(defense_params or {})},
        "keys": [{"name": f"key{i}", "key": key, "budget": None if budget is None else int(budget),
                  **({"operator": True} if key in (operators or set()) else {})}
                 for i, (key, budget) in enumerate(keys.items())],
        "ownership": ownership if ownership is not None else {"watermark": {"enabled": False},
                                                              "detector": {"enabled": False}},
    }
    path = directory / "guard.toml"
    path.write_text(to_toml(config), encoding="utf-8")
    return path
