"""Hugging Face model folders scanned without loading them (scan/hf_folder.py): a clean save_pretrained folder is
clean; auto_map (the folder's own code), shipped .py files and pickled weights are flagged; a pickle that runs code is
critical. Nothing in the folder is imported or unpickled."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from modelward.errors import DataError
from modelward.scan.hf_folder import scan_hf_folder

pytest.importorskip("picklescan", reason="the scan extra is not installed")


class _Boom:
    def __reduce__(self):  # noqa: ANN204 - what a hostile pytorch_model.bin carries
        return (__import__("os").system, ("echo pwned",))


def _folder(tmp_path):  # noqa: ANN001, ANN202
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "num_labels": 2}))
    save_file({"classifier.weight": torch.zeros(2, 4)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "tokenizer.json").write_text("{}")
    return tmp_path


def test_a_clean_folder_is_clean(tmp_path):
    scans = scan_hf_folder(_folder(tmp_path))
    assert [s.path.rsplit("/", 1)[-1] for s in scans] == ["config.json", "model.safetensors"]
    assert all(s.clean for s in scans)


def test_remote_code_python_files_and_pickles_are_flagged(tmp_path):
    d = _folder(tmp_path)
    (d / "config.json").write_text(json.dumps({"model_type": "x", "auto_map": {"AutoModel": "modeling_x.XModel"}}))
    (d / "modeling_x.py").write_text("import os\nos.system('echo pwned')\n")
    torch.save({"w": torch.zeros(2)}, d / "pytorch_model.bin")
    (d / "optimizer.pt").write_bytes(pickle.dumps(_Boom()))
    by = {s.path.rsplit("/", 1)[-1]: s for s in scan_hf_folder(d)}
    assert by["config.json"].issues[0].kind == "remote_code" and by["config.json"].severity == "high"
    assert by["modeling_x.py"].severity == "high"
    assert [i.kind for i in by["pytorch_model.bin"].issues] == ["pickle_format"]  # clean, but a pickle: low
    assert by["pytorch_model.bin"].severity == "low" and "safetensors" in by["pytorch_model.bin"].issues[0].detail
    assert by["optimizer.pt"].severity == "critical"
    assert by["model.safetensors"].clean


def test_not_a_folder_is_refused(tmp_path):
    with pytest.raises(DataError, match="no config.json"):
        scan_hf_folder(tmp_path)
