"""Every command that runs training / evaluation / attack / defense / certification / RL loops takes ``--device``
and refuses a device this machine does not have with a clear error before doing any work (no output folder, no
model loaded, no port bound). Run in-process through the CLI entry point (cheap: nothing is trained)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from modelward.cli.main import main

EX = Path(__file__).resolve().parents[2] / "examples"

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal of a missing CUDA device")

# (command line before --device, whether it takes --out)
COMMANDS = [
    (["train", str(EX / "completion_digits.toml")], "file"),
    (["robust", "train", str(EX / "robust_gloro.toml")], "dir"),
    (["robust", "certify", str(EX / "robust_gloro.toml")], "dir"),
    (["robust", "attack", str(EX / "robust_pgd.toml")], "dir"),
    (["study", "plasticity", str(EX / "plasticity.toml")], "dir"),
    (["extract", "run", str(EX / "extraction_digits.toml")], "dir"),
    (["complete", "run", str(EX / "completion_digits.toml")], "dir"),
    (["complete", "run", str(EX / "completion_cartpole.toml")], "dir"),
    (["privacy", "audit", str(EX / "privacy_bcw.toml")], "dir"),
    (["explain", str(EX / "explain_digits.toml")], "dir"),
    (["bias", str(EX / "bias_digits_deep.toml")], "dir"),
]


@pytest.mark.parametrize(("argv", "kind"), COMMANDS, ids=[" ".join(c[0][:2]).replace(str(EX) + "/", "")
                                                            for c in COMMANDS])
def test_unavailable_device_is_refused_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       argv: list[str], kind: str) -> None:
    out = tmp_path / ("model.safetensors" if kind == "file" else "out")
    with pytest.raises(SystemExit) as e:
        main([*argv, "--out", str(out), "--device", "cuda"])
    assert e.value.code == 2
    err = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert "no CUDA GPU is available" in err and "'auto' or 'cpu'" in err
    assert not out.exists()  # refused before the output folder (or anything else) was touched


def test_device_setting_in_the_file_is_refused_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    with pytest.raises(SystemExit):
        main(["robust", "train", str(EX / "robust_gloro.toml"), "--out", str(out), "--set", "device=cuda:1"])
    assert "no CUDA GPU" in capsys.readouterr().err and not out.exists()
    with pytest.raises(SystemExit):
        main(["robust", "train", str(EX / "robust_gloro.toml"), "--out", str(out), "--device", "gpu"])
    err = " ".join(capsys.readouterr().err.split())
    assert "device" in err and "cuda:N" in err and not out.exists()  # the valid choices are named


def test_guard_serve_refuses_before_serving(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["guard", "serve", str(EX / "guard_modelguard_s.toml"), "--port", "0", "--device", "cuda:0"])
    assert e.value.code == 2 and "no CUDA GPU" in capsys.readouterr().err


def test_device_cpu_and_auto_train(tmp_path: Path) -> None:
    # the default path, spelled out: --device cpu / auto train and save a model that loads on the CPU
    from modelward.core.io import load_state_dict

    for dev in ("cpu", "auto"):
        out = tmp_path / f"{dev}.safetensors"
        with pytest.raises(SystemExit) as e:
            main(["train", str(EX / "completion_digits.toml"), "--out", str(out), "--device", dev,
                  "--set", "train.steps=5", "--set", "train.eval_every=5"])
        assert e.value.code == 0
        tensors, _ = load_state_dict(out)
        assert tensors and all(t.device.type == "cpu" for t in tensors.values())


def test_a_run_resumes_on_another_device_setting(tmp_path: Path) -> None:
    # the device is not part of a run's identity: `robust train` re-run with another --device reuses the folder
    # (no "different config" refusal), and the recorded config.json does not name a device
    import json

    out = tmp_path / "r"
    tiny = ["--set", "model.arch=d(16)", "--set", "train.epochs=1", "--set", "train.batch_size=256",
            "--set", "evaluate.max_points=20"]
    for dev in ("cpu", "auto"):
        with pytest.raises(SystemExit) as e:
            main(["robust", "train", str(EX / "robust_gloro.toml"), "--out", str(out), *tiny, "--device", dev])
        assert e.value.code == 0
    assert "device" not in json.loads((out / "config.json").read_text())
