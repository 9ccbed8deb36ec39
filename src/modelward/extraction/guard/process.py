"""Helpers to run the guarded service in a subprocess (tests, benchmarks, the demo) and to write its config."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from torch import nn

from modelward.core import ports
from modelward.core.config import read_toml, to_toml
from modelward.core.io import save_state_dict
from modelward.core.process import stop_gracefully
from modelward.core.zoo import ModelConfig
from modelward.errors import ModelwardError


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1, outside the range the kernel hands to outgoing connections
    (:func:`modelward.core.ports.free_port`)."""
    return ports.free_port()


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
                       overrides: list[str] | None = None, reset: bool = False,
                       env: dict[str, str] | None = None) -> GuardServerProcess:
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
    penv = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), **(env or {}))
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=penv)
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


def write_guard_config(directory: str | Path, model: nn.Module | None, model_cfg: ModelConfig,
                       input_shape: tuple[int, ...] | list[int], num_classes: int,
                       defense: str = "modelguard_s", defense_params: dict[str, Any] | None = None,
                       keys: dict[str, int | None] | None = None, name: str = "model",
                       server: dict[str, Any] | None = None, ownership: dict[str, Any] | None = None,
                       operators: set[str] | None = None, upstream: dict[str, Any] | None = None) -> Path:
    """Save ``model`` as a safetensors checkpoint in ``directory`` and write a GUARD.toml serving it.

    ``keys`` maps API key -> query budget (None = unlimited); key names are ``key0, key1, ...``; keys in
    ``operators`` may read ``/v2/guard/status``. ``ownership`` is the ``[ownership]`` table; when it is None the
    watermark and the detector are written *off*, so the answers are exactly the defense's (studies and the
    demo measure a defense alone; a hand-written GUARD.toml gets both on by default).
    ``upstream`` (the ``[upstream]`` table) writes a proxy-mode config instead: no checkpoint, ``model`` None.
    Returns the path of the written ``guard.toml``.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if upstream is None:
        assert model is not None, "a direct-mode config needs the model whose weights it serves"
        save_state_dict(directory / "model.safetensors", model.state_dict(), {"arch": model_cfg.model_dump()})
    keys = keys or {"modelward-demo-key": None}
    config = {
        "server": {"host": "127.0.0.1", **(server or {})},
        "model": {"name": name, **({} if upstream else {"checkpoint": "model.safetensors"}),
                  "input_shape": list(input_shape), "num_classes": int(num_classes),
                  "net": model_cfg.model_dump(exclude_none=True)},
        "defense": {"name": defense, "params": dict(defense_params or {})},
        "keys": [{"name": f"key{i}", "key": key, "budget": None if budget is None else int(budget),
                  **({"operator": True} if key in (operators or set()) else {})}
                 for i, (key, budget) in enumerate(keys.items())],
        "ownership": ownership if ownership is not None else {"watermark": {"enabled": False},
                                                              "detector": {"enabled": False}},
    }
    if upstream:
        config["upstream"] = dict(upstream)
    path = directory / "guard.toml"
    path.write_text(to_toml(config), encoding="utf-8")
    return path


#: the bench-only / test-only environment with KServe (it pins protobuf, pandas and python-dateutil versions of its
#: own, so it never shares modelward's environment); examples/deploy/README.md says how to make it
KSERVE_PYTHON = Path(os.environ.get("MODELWARD_KSERVE_PYTHON")
                     or Path(__file__).resolve().parents[4] / ".venv-kserve" / "bin" / "python")
KSERVE_MODEL = Path(__file__).resolve().parents[4] / "examples" / "deploy" / "kserve_model.py"


class UpstreamProcess:
    """A model server subprocess on 127.0.0.1 (``.url``, ``.model_name``, ``.stop()``, context manager)."""

    def __init__(self, proc: subprocess.Popen, url: str, model_name: str, log_path: Path) -> None:
        self.proc, self.url, self.model_name, self.log_path = proc, url, model_name, log_path

    def stop(self, timeout: float = 10.0) -> int:
        return stop_gracefully(self.proc, timeout)

    def __enter__(self) -> UpstreamProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_kserve_model(checkpoint: str | Path, name: str, input_shape: tuple[int, ...] | list[int],
                       num_classes: int, output: str = "logits", python: str | Path | None = None,
                       port: int | None = None, timeout: float = 90.0,
                       tls: tuple[str | Path, str | Path] | None = None) -> UpstreamProcess:
    """Start a KServe ``ModelServer`` serving ``checkpoint`` (examples/deploy/kserve_model.py) from the KServe
    environment (``python``, default :data:`KSERVE_PYTHON`) and wait until the model is ready.

    Args:
        checkpoint: a checkpoint written by :func:`write_guard_config`.
        name, input_shape, num_classes: the model as the upstream serves it.
        output: ``"logits"`` or ``"probs"``.
        python: the interpreter with ``kserve`` installed.
        port: the HTTP port (default: a free one).
        timeout: seconds to wait for readiness.
        tls: ``(certfile, keyfile)`` to serve https.

    Returns:
        The running :class:`UpstreamProcess`.
    """
    import httpx

    python = Path(python or KSERVE_PYTHON)
    if not python.is_file():
        raise ModelwardError(f"{python}: no KServe environment (see examples/deploy/README.md)")
    port = port or free_port()
    log_path = Path(checkpoint).parent / f"kserve-{port}.log"
    cmd = [str(python), str(KSERVE_MODEL), "--checkpoint", str(checkpoint), "--name", name, "--input-shape",
           ",".join(map(str, input_shape)), "--num-classes", str(num_classes), "--output", output,
           "--http-port", str(port)]
    if tls is not None:
        cmd += ["--ssl-certfile", str(tls[0]), "--ssl-keyfile", str(tls[1])]
    src = str(Path(__file__).resolve().parents[3])
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               PYTHONPATH=os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p))
    log = open(log_path, "wb")  # noqa: SIM115 - owned by the child for its lifetime
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    log.close()
    scheme = "https" if tls else "http"
    up = UpstreamProcess(proc, f"{scheme}://127.0.0.1:{port}", name, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ModelwardError(f"the KServe model server exited with code {proc.returncode}: "
                                 f"{log_path.read_text(errors='replace')[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v2/models/{name}/ready" if not tls else
                         f"https://127.0.0.1:{port}/v2/models/{name}/ready", timeout=1.0,
                         verify=False).status_code == 200:  # noqa: S501 - readiness of our own child only
                return up
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    up.stop()
    raise ModelwardError(f"the KServe model server did not become ready within {timeout:.0f} s (log: {log_path})")
