"""Entry points named in configs are code: refused, before any import, unless the user says they trust it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from modelward.core.entrypoints import TRUST_ENV, load_entrypoint, trust_code
from modelward.core.zoo import ModelConfig, build_model
from modelward.errors import ConfigError, UntrustedCodeError

SRC = str(Path(__file__).resolve().parents[2] / "src")

HOSTILE = '''
from pathlib import Path
Path(__file__).with_name("imported.flag").write_text("the module ran at import")

def build(input_shape=None, num_classes=None):
    Path(__file__).with_name("called.flag").write_text("the factory ran")
    import torch
    return torch.nn.Linear(4, num_classes)
'''


@pytest.fixture()
def hostile(tmp_path, monkeypatch):
    """A module that leaves a flag file when imported and another when its factory is called."""
    (tmp_path / "hostile_mod.py").write_text(HOSTILE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(TRUST_ENV, raising=False)
    sys.modules.pop("hostile_mod", None)
    yield tmp_path
    sys.modules.pop("hostile_mod", None)


def test_an_entrypoint_is_refused_before_it_is_imported(hostile):
    cfg = ModelConfig(arch="entrypoint", entrypoint="hostile_mod:build")
    with pytest.raises(UntrustedCodeError) as e:
        build_model(cfg, (4,), 2)
    msg = str(e.value)
    assert "'hostile_mod:build'" in msg and "--trust-code" in msg and "trust_code = true" in msg and "\n" not in msg
    assert not (hostile / "imported.flag").exists() and not (hostile / "called.flag").exists()
    # the attack from the issue: a shell command through os:system
    with pytest.raises(UntrustedCodeError, match="os:system"):
        build_model(ModelConfig(arch="entrypoint", entrypoint="os:system", kwargs={"command": "true"}), (4,), 2)


def test_the_config_switch_and_the_process_switch_let_it_run(hostile):
    net = build_model(ModelConfig(arch="entrypoint", entrypoint="hostile_mod:build", trust_code=True), (4,), 3)
    assert isinstance(net, torch.nn.Linear) and (hostile / "called.flag").exists()
    (hostile / "called.flag").unlink()
    try:
        trust_code()
        assert os.environ[TRUST_ENV] == "1"
        build_model(ModelConfig(arch="entrypoint", entrypoint="hostile_mod:build"), (4,), 3)
        assert (hostile / "called.flag").exists()
    finally:
        trust_code(False)


def test_trust_is_never_written_out_and_a_checkpoint_cannot_grant_it(hostile):
    """A dumped config (a study's fingerprint, a checkpoint's metadata) carries no trust; a file claiming it is
    ignored: the explain loader refuses the entry point a checkpoint names."""
    import pickle

    from modelward.core.io import save_state_dict
    from modelward.explain.study import load_checkpoint

    assert "trust_code" not in ModelConfig(trust_code=True).model_dump()
    assert pickle.loads(pickle.dumps(ModelConfig(trust_code=True))).trust_code  # worker processes keep it
    meta = {"model": {"arch": "entrypoint", "entrypoint": "hostile_mod:build", "trust_code": True},
            "input_shape": [4], "num_classes": 2}
    save_state_dict(hostile / "m.safetensors", {"weight": torch.zeros(2, 4), "bias": torch.zeros(2)}, meta)
    with pytest.raises(UntrustedCodeError, match="hostile_mod:build"):
        load_checkpoint(hostile / "m.safetensors")
    assert not (hostile / "imported.flag").exists() and not (hostile / "called.flag").exists()


def test_shipped_factories_need_no_switch_but_other_modelward_callables_do(monkeypatch):
    monkeypatch.delenv(TRUST_ENV, raising=False)
    assert load_entrypoint("modelward.cost.models:square_mlp").__name__ == "square_mlp"
    with pytest.raises(UntrustedCodeError):  # modelward's own, but not a marked factory (it writes files)
        load_entrypoint("modelward.core.records:write_json")
    with pytest.raises(ConfigError, match="expected 'package.module:factory'"):
        load_entrypoint("os.system")


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{cwd}{os.pathsep}{SRC}"}
    env.pop(TRUST_ENV, None)
    return subprocess.run([sys.executable, "-m", "modelward.cli.main", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env=env)


def test_parts_refuses_an_entrypoint_from_set_in_one_line_and_runs_it_with_trust_code(hostile):
    """`modelward parts` is a dry run: `--set model.entrypoint=…` must not run code unless --trust-code is given."""
    (hostile / "m.toml").write_text("input_shape = [4]\nnum_classes = 2\n[model]\narch = \"mlp\"\n")
    overrides = ["--set", "model.arch=entrypoint", "--set", "model.entrypoint=hostile_mod:build"]
    r = _cli(["parts", "--model", "m.toml", *overrides], hostile)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "hostile_mod:build" in r.stderr and "--trust-code" in r.stderr
    assert not (hostile / "imported.flag").exists() and not (hostile / "called.flag").exists()
    r = _cli(["parts", "--model", "m.toml", *overrides, "--trust-code"], hostile)
    assert r.returncode == 0, r.stderr
    assert (hostile / "called.flag").exists()


def test_guard_check_is_a_dry_run_that_never_runs_an_entrypoint(hostile):
    """The issue's attack: `guard check` (documented as a dry run) ran the config's entry point."""
    import shutil

    shutil.copy(Path(__file__).resolve().parents[2] / "examples" / "guard_modelguard_s.toml", hostile / "g.toml")
    r = _cli(["guard", "check", "g.toml", "--set", "model.net.arch=entrypoint", "--set",
              "model.net.entrypoint=hostile_mod:build"], hostile)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "hostile_mod:build" in r.stderr and "--trust-code" in r.stderr
    assert not (hostile / "imported.flag").exists() and not (hostile / "called.flag").exists()
