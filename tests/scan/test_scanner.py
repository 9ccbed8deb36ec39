"""The model-file scanner against a corpus the test builds itself: 14 malicious files (each would run code if
unpickled; none is ever loaded here) must all be flagged, 16 plain checkpoints and safetensors files must not be."""

from __future__ import annotations

import builtins
import io
import json
import operator
import os
import pickle
import runpy
import shutil
import subprocess
import webbrowser
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

pytest.importorskip("picklescan", reason="the picklescan package is not installed (modelward[scan])")

from modelward.errors import DataError  # noqa: E402
from modelward.scan import load_checked_torch_file, scan_file, scan_paths  # noqa: E402


class _Reduce:
    """Pickles as a call of `fn(*args)`: what a hostile checkpoint does (the call happens only on unpickling)."""

    def __init__(self, fn: object, args: tuple) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple:
        return (self.fn, self.args)


def _zip_bytes(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def malicious_corpus(d: Path) -> list[Path]:
    d.mkdir(parents=True, exist_ok=True)
    files = {
        "os_system.pkl": pickle.dumps(_Reduce(os.system, ("echo pwned",)), protocol=4),
        "eval.pkl": pickle.dumps(_Reduce(builtins.eval, ("1+1",)), protocol=2),
        "exec.pkl": pickle.dumps(_Reduce(builtins.exec, ("x = 1",))),
        "subprocess.pkl": pickle.dumps(_Reduce(subprocess.Popen, (["echo", "pwned"],))),
        "runpy.pkl": pickle.dumps(_Reduce(runpy._run_code, ("x = 1", {}))),
        "webbrowser.pkl": pickle.dumps(_Reduce(webbrowser.open, ("http://127.0.0.1:1/",))),
        "shutil.pkl": pickle.dumps(_Reduce(shutil.rmtree, ("/nonexistent",))),
        "import.pkl": pickle.dumps(_Reduce(builtins.__import__, ("os",))),
        "attrgetter.pkl": pickle.dumps(_Reduce(operator.attrgetter, ("system",))),
        # builtins.getattr(object, "__subclasses__")() — a getattr chain, hand-written protocol 0
        "getattr_chain.pkl": b"cbuiltins\ngetattr\n(cbuiltins\nobject\nS'__subclasses__'\ntR)R.",
        "proto0_posix.bin": b"cposix\nsystem\n(S'echo pwned'\ntR.",
    }
    for name, data in files.items():
        (d / name).write_bytes(data)
    torch.save({"w": torch.zeros(2), "x": _Reduce(os.system, ("echo pwned",))}, d / "torch_zip.pt")
    torch.save({"w": torch.zeros(2), "x": _Reduce(builtins.exec, ("x = 1",))}, d / "torch_legacy.pth",
               _use_new_zipfile_serialization=False)
    # a PyTorch zip inside a zip inside a zip (picklescan itself looks one level deep)
    inner = (d / "torch_zip.pt").read_bytes()
    (d / "nested.zip").write_bytes(_zip_bytes({"outer/inner.zip": _zip_bytes({"m/model.pt": inner})}))
    # a checkpoint layout (archive/data.pkl) under another suffix
    (d / "renamed.ckpt").write_bytes(_zip_bytes({"archive/data.pkl": files["os_system.pkl"],
                                                 "archive/version": b"3\n"}))
    return sorted(p for p in d.iterdir())


def clean_corpus(d: Path) -> list[Path]:
    d.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    for i in range(6):
        m = torch.nn.Sequential(torch.nn.Linear(8 + i, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3),
                                torch.nn.BatchNorm1d(3))
        torch.save(m.state_dict(), d / f"sd{i}.pt")
        save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(d / f"sd{i}.safetensors"),
                  metadata={"note": "plain"})
    cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 30 * 30, 10))
    torch.save(cnn.state_dict(), d / "cnn.pth")
    torch.save({"state_dict": m.state_dict(), "epoch": 3}, d / "wrapped.ckpt")
    torch.save(m.state_dict(), d / "legacy.bin", _use_new_zipfile_serialization=False)
    torch.save({"w": torch.zeros(3, dtype=torch.float16), "i": torch.arange(3)}, d / "mixed.pt")
    return sorted(d.iterdir())


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], list[Path]]:
    root = tmp_path_factory.mktemp("scan")
    return malicious_corpus(root / "bad"), clean_corpus(root / "good")


def test_every_malicious_fixture_is_flagged(corpus: tuple[list[Path], list[Path]]) -> None:
    bad, _ = corpus
    assert len(bad) >= 14
    scans = {p.name: scan_file(p) for p in bad}
    missed = [n for n, s in scans.items() if s.clean]
    assert missed == []
    # code execution is reported as critical, naming the global
    assert scans["os_system.pkl"].severity == "critical"
    assert any(i.name == "system" for i in scans["os_system.pkl"].issues)
    assert any(i.name == "getattr" for i in scans["getattr_chain.pkl"].issues)
    assert any("inner.zip" in i.where for i in scans["nested.zip"].issues)
    assert scans["torch_zip.pt"].format == "torch_zip" and scans["torch_zip.pt"].severity == "critical"


def test_plain_checkpoints_and_safetensors_are_clean(corpus: tuple[list[Path], list[Path]]) -> None:
    _, good = corpus
    assert len(good) >= 16
    scans = scan_paths([good[0].parent])
    assert len(scans) == len(good)
    assert [(s.path, [i.detail for i in s.issues]) for s in scans if not s.clean] == []
    assert all(len(s.sha256) == 64 for s in scans)


def test_a_tampered_safetensors_header_is_flagged(tmp_path: Path) -> None:
    save_file({"w": torch.zeros(4)}, str(tmp_path / "ok.safetensors"))
    raw = (tmp_path / "ok.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = raw[8 : 8 + n].replace(b"[0,16]", b"[0,64]")
    (tmp_path / "bad.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + raw[8 + n :])
    assert scan_file(tmp_path / "ok.safetensors").clean
    bad = scan_file(tmp_path / "bad.safetensors")
    assert not bad.clean and bad.issues[0].kind == "malformed"
    (tmp_path / "huge.safetensors").write_bytes((2**40).to_bytes(8, "little") + b"{}")
    assert not scan_file(tmp_path / "huge.safetensors").clean


def test_only_a_clean_file_is_loaded_and_with_weights_only(corpus: tuple[list[Path], list[Path]],
                                                           tmp_path: Path) -> None:
    bad, good = corpus
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.pt"
    torch.save({"w": torch.zeros(1), "x": _Reduce(os.system, (f"touch {marker}",))}, evil)
    with pytest.raises(DataError, match="refused without loading"):
        load_checked_torch_file(evil)
    assert not marker.exists()  # nothing ran
    tensors, scan = load_checked_torch_file(next(p for p in good if p.name == "wrapped.ckpt"))
    assert scan.clean and set(tensors) == {"0.weight", "0.bias", "2.weight", "2.bias", "3.weight", "3.bias",
                                           "3.running_mean", "3.running_var", "3.num_batches_tracked"}


def test_a_missing_file_names_the_path_tried(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=str(tmp_path / "nope.pt")):
        scan_file(tmp_path / "nope.pt")


def test_assess_refuses_a_hostile_checkpoint_before_loading_anything(tmp_path: Path) -> None:
    from modelward.assess import AssessConfig, run_assessment

    marker = tmp_path / "ran"
    torch.save({"0.weight": torch.zeros(2, 64), "x": _Reduce(os.system, (f"touch {marker}",))}, tmp_path / "m.pt")
    cfg = AssessConfig.model_validate({"checkpoint": "m.pt", "sections": ["robustness"],
                                       "model": {"arch": "mlp"}}).resolve_paths(tmp_path)
    with pytest.raises(DataError, match="refused without loading.*posix.system|refused without loading.*system"):
        run_assessment(cfg, tmp_path / "out")
    assert not marker.exists()
    assert not (tmp_path / "out" / "robustness").exists()  # no section ran
    scan = json.loads((tmp_path / "out" / "supply_chain.json").read_text())
    assert scan["findings"][0]["severity"] == "critical" and scan["findings"][0]["owasp"]


def test_without_the_scanner_a_pickle_is_refused_with_the_conversion(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins as b

    torch.save({"w": torch.zeros(2)}, tmp_path / "m.pt")
    real_import = b.__import__

    def no_picklescan(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("picklescan"):
            raise ImportError("No module named 'picklescan'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(b, "__import__", no_picklescan)
    with pytest.raises(DataError, match="weights_only=True.*save_file"):
        load_checked_torch_file(tmp_path / "m.pt")
