"""Config errors say what the user probably meant and blame the --set that gave the bad value (issue 31 item 11)."""

from __future__ import annotations

import pytest

from modelward.core.config import StrictModel, did_you_mean, load_config
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig
from modelward.errors import ConfigError


class File(StrictModel):
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    seeds: list[int] = [0]


def test_an_unknown_key_gets_the_closest_valid_name(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[model]\narchitecture = "mlp"\n[train]\nsteps = 5\neval_evry = 2\n')
    with pytest.raises(ConfigError) as e:
        load_config(p, File)
    lines = str(e.value).splitlines()
    assert f"{p}: field 'model.architecture': unknown field (did you mean 'arch'?)" in lines
    assert f"{p}: field 'train.eval_evry': unknown field (did you mean 'eval_every'?)" in lines
    p.write_text("sedes = [1]\n")
    with pytest.raises(ConfigError, match=r"field 'sedes': unknown field \(did you mean 'seeds'\?\)"):
        load_config(p, File)
    p.write_text("zzzz = 1\n")  # nothing close: the general hint
    with pytest.raises(ConfigError, match="check spelling"):
        load_config(p, File)
    assert did_you_mean("qqq", ["lr"]) == ""


def test_an_error_in_a_set_value_is_blamed_on_the_set_not_the_file(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[model]\narch = "mlp"\n[train]\nsteps = 5\n')
    with pytest.raises(ConfigError) as e:
        load_config(p, File, ["train.steps=many", "model.archh=cnn"])
    lines = str(e.value).splitlines()
    assert any(x.startswith("--set train.steps=many: field 'train.steps'") for x in lines), lines
    assert "--set model.archh=cnn: field 'model.archh': unknown field (did you mean 'arch'?)" in lines
    p.write_text('[model]\narch = "mlpp"\n')  # the file's own mistake is still the file's
    with pytest.raises(ConfigError, match=rf"^{p}: field 'model.arch'"):
        load_config(p, File, ["train.steps=7"])
