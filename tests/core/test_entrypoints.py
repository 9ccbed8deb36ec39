"""Entry points named in configs are code: refused, before any import, unless the user says they trust it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from modelward.core.config import StrictModel, allow_code, load_config, validate
from modelward.core.entrypoints import (
    TRUST_DIR_ENV,
    TRUST_ENV,
    allow_config,
    load_entrypoint,
    revoke_config,
    trust_code,
)
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
    monkeypatch.setenv(TRUST_DIR_ENV, str(tmp_path / "operator"))  # never the real operator's trust list
    sys.modules.pop("hostile_mod", None)
    yield tmp_path
    sys.modules.pop("hostile_mod", None)


def test_an_entrypoint_is_refused_before_it_is_imported(hostile):
    cfg = ModelConfig(arch="entrypoint", entrypoint="hostile_mod:build")
    with pytest.raises(UntrustedCodeError) as e:
        build_model(cfg, (4,), 2)
    msg = str(e.value)
    assert "'hostile_mod:build'" in msg and "--trust-code" in msg and "\n" not in msg
    assert "modelward trust allow" in msg and TRUST_ENV in msg and "trust_code = true" not in msg
    assert not (hostile / "imported.flag").exists() and not (hostile / "called.flag").exists()
    # the attack from the issue: a shell command through os:system
    with pytest.raises(UntrustedCodeError, match="os:system"):
        build_model(ModelConfig(arch="entrypoint", entrypoint="os:system", kwargs={"command": "true"}), (4,), 2)


def test_trust_comes_from_the_caller_or_the_process_never_from_the_config(hostile):
    """Issue 37 item 3: the config's own ``trust_code`` is gone (a clear error says what to do); the caller's
    allow_code (transformers' trust_remote_code) and the process switch let the entry point run."""
    with pytest.raises(ConfigError, match="can no longer authorise its own code") as e:
        validate(ModelConfig, {"arch": "entrypoint", "entrypoint": "hostile_mod:build", "trust_code": True})
    assert "modelward trust allow" in str(e.value) and "--trust-code" in str(e.value)
    with pytest.raises(ValueError, match="can no longer authorise its own code"):  # the old Python spelling
        ModelConfig(arch="entrypoint", entrypoint="hostile_mod:build", trust_code=True)
    assert not (hostile / "imported.flag").exists()
    net = build_model(allow_code(ModelConfig(arch="entrypoint", entrypoint="hostile_mod:build")), (4,), 3)
    assert isinstance(net, torch.nn.Linear) and (hostile / "called.flag").exists()
    (hostile / "called.flag").unlink()
    try:
        trust_code()
        assert os.environ[TRUST_ENV] == "1"
        build_model(ModelConfig(arch="entrypoint", entrypoint="hostile_mod:build"), (4,), 3)
        assert (hostile / "called.flag").exists()
    finally:
        trust_code(False)


def test_a_config_file_cannot_trust_itself_but_the_operators_list_can(hostile):
    """A file with the retired key is refused naming the three switches; ``modelward trust allow`` (the file's
    SHA-256 in the operator's folder) trusts exactly these bytes: an edit revokes it, revoke removes it, and a list
    others can write is not believed."""
    cfg = hostile / "m.toml"
    body = '[model]\narch = "entrypoint"\nentrypoint = "hostile_mod:build"\n'
    cfg.write_text(body + "trust_code = true\n")
    with pytest.raises(ConfigError) as e:
        load_config(cfg, _ModelFile)
    msg = str(e.value)
    assert "model.trust_code" in msg and f"modelward trust allow {cfg}" in msg and TRUST_ENV in msg, msg
    cfg.write_text(body)
    with pytest.raises(ConfigError, match="can no longer authorise"):  # nor through --set
        load_config(cfg, _ModelFile, ["model.trust_code=true"])
    loaded = load_config(cfg, _ModelFile)
    assert not loaded.code_trusted and not loaded.model.code_trusted
    with pytest.raises(UntrustedCodeError, match=f"modelward trust allow {cfg}"):
        build_model(loaded.model, (4,), 2)
    allow_config(cfg)
    assert oct((hostile / "operator" / "trusted_configs.json").stat().st_mode & 0o777) == "0o600"
    loaded = load_config(cfg, _ModelFile)
    assert loaded.model.code_trusted
    build_model(loaded.model, (4,), 2)
    assert (hostile / "called.flag").exists()
    assert not loaded.model.model_validate(loaded.model.model_dump()).code_trusted  # a dump carries no trust
    assert loaded.model == ModelConfig(arch="entrypoint", entrypoint="hostile_mod:build")  # trust is not its value
    cfg.write_text(body + "kwargs = {}\n")  # edited after it was allowed: another hash
    assert not load_config(cfg, _ModelFile).model.code_trusted
    allow_config(cfg)
    (hostile / "operator" / "trusted_configs.json").chmod(0o666)
    with pytest.raises(ConfigError, match="writable by other users"):
        load_config(cfg, _ModelFile)
    (hostile / "operator" / "trusted_configs.json").chmod(0o600)
    assert revoke_config(cfg) == 2  # both versions
    assert not load_config(cfg, _ModelFile).model.code_trusted


class _ModelFile(StrictModel):
    model: ModelConfig


def test_trust_is_never_written_out_and_a_checkpoint_cannot_grant_it(hostile):
    """A dumped config (a study's fingerprint, a checkpoint's metadata) carries no trust; a file claiming it is
    ignored: the explain loader refuses the entry point a checkpoint names."""
    import pickle

    from modelward.core.io import save_state_dict
    from modelward.explain.study import load_checkpoint

    assert "trust_code" not in allow_code(ModelConfig()).model_dump()
    assert pickle.loads(pickle.dumps(allow_code(ModelConfig()))).code_trusted  # worker processes keep it
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
    env = {**os.environ, "PYTHONPATH": f"{cwd}{os.pathsep}{SRC}", TRUST_DIR_ENV: str(cwd / "operator")}
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


def _main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """The CLI in this process: (exit code, stdout + stderr with the line breaks of rich's wrapping removed)."""
    from modelward.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    out = capsys.readouterr()
    return int(e.value.code or 0), " ".join((out.out + out.err).split())


def test_guard_check_of_a_config_that_trusts_itself_runs_no_code(hostile, capsys):
    """Issue 37 item 3, "done when": a received config setting ``trust_code = true`` itself makes ``guard check``
    run nothing, and the message says how the operator trusts it instead; after ``modelward trust allow`` (by the
    operator, on the edited file) the same check runs the factory."""
    text = (Path(__file__).resolve().parents[2] / "examples" / "guard_modelguard_s.toml").read_text()
    net = '[model.net]\narch = "entrypoint"\nentrypoint = "hostile_mod:build"\n'
    start = text.index("\n[model.net]") + 1
    end = text.index("\n[", start + 1)
    g = hostile / "g.toml"
    g.write_text(text[:start] + net + "trust_code = true\n" + text[end:])
    code, err = _main(["guard", "check", str(g)], capsys)
    assert code == 2 and "Traceback" not in err, err
    assert "model.net.trust_code" in err and f"modelward trust allow {g}" in err and "--trust-code" in err, err
    assert not (hostile / "imported.flag").exists() and not (hostile / "called.flag").exists()
    g.write_text(text[:start] + net + text[end:])
    code, err = _main(["guard", "check", str(g)], capsys)
    assert code == 2 and f"modelward trust allow {g}" in err, err
    assert not (hostile / "imported.flag").exists() and not (hostile / "called.flag").exists()
    code, out = _main(["trust", "allow", str(g)], capsys)
    assert code == 0 and f"trusted {g}" in out, out
    _main(["guard", "check", str(g)], capsys)  # the factory runs (the example's weights then do not fit it)
    assert (hostile / "called.flag").exists()
    assert _main(["trust", "list"], capsys)[1].startswith("trusted")
