"""Issue 38 item 6: the scanner reports every file it is given or walks, and reads Keras (HDF5 and v3), ONNX,
TensorFlow SavedModel and GGUF files — each test writes its own files (a real .h5 with h5py, a real ONNX model with
the onnx package, SavedModel and GGUF bytes per their format specs).

Before the fix `modelward scan bad good` walked only known suffixes (a Keras .h5 with a Lambda layer was dropped:
"21 file(s)" of 22) and the same file given directly was "low: not a recognised format".
"""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

import pytest
import torch

from modelward.scan import scan_exit_code, scan_file, scan_paths

pytest.importorskip("picklescan", reason="the picklescan package is not installed (modelward[scan])")

LAMBDA_LAYER = {"class_name": "Lambda", "config": {"name": "evil", "function": ["4wEAAAAAAAAA", None, None],
                                                   "function_type": "lambda"}}


def _keras_config(*layers: dict) -> dict:
    dense = {"class_name": "Dense", "config": {"name": "dense", "units": 2}}
    return {"class_name": "Sequential", "config": {"name": "m", "layers": [dense, *layers]}}


def _write_h5(path: Path, config: dict | None) -> None:
    h5py = pytest.importorskip("h5py", reason="h5py reads Keras .h5 files (modelward[scan])")
    with h5py.File(path, "w") as f:
        if config is not None:
            f.attrs["model_config"] = json.dumps(config)
            f.attrs["keras_version"] = "2.12.0"
            f.attrs["backend"] = "tensorflow"
        f.create_group("model_weights").create_dataset("dense/kernel:0", data=[[0.0, 1.0]])


def test_keras_h5_lambda_is_flagged_and_a_folder_walk_skips_nothing(tmp_path: Path) -> None:
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir()
    bad.mkdir()
    torch.save({"w": torch.zeros(2)}, good / "sd.pt")
    _write_h5(good / "plain.h5", _keras_config())
    _write_h5(good / "data.hdf5", None)
    (good / "README.md").write_text("# weights of the model\n")
    nested = {"class_name": "Functional", "config": {"layers": [{"class_name": "Sequential", "config": {
        "layers": [LAMBDA_LAYER]}}]}}
    _write_h5(bad / "lambda.h5", _keras_config(nested))
    direct = scan_file(bad / "lambda.h5")
    assert direct.format == "keras_h5" and direct.severity == "high"
    assert any(i.kind == "unsafe_layer" and "'evil'" in i.detail for i in direct.issues)  # nested: found too
    scans = scan_paths([bad, good])
    assert len(scans) == 5  # every file walked is reported
    by = {Path(s.path).name: s for s in scans}
    assert by["plain.h5"].clean and by["data.hdf5"].clean and by["sd.pt"].clean
    readme = by["README.md"]
    assert not readme.scanned and readme.severity == "medium" and "not scanned" in readme.issues[0].detail
    assert scan_exit_code(scans) == 1  # the Lambda layer
    assert scan_exit_code([s for s in scans if s is not direct and "lambda" not in s.path]) == 0
    assert scan_exit_code([readme], strict=True) == 1 and scan_exit_code([readme]) == 0


def test_keras_v3_archive_config_is_read(tmp_path: Path) -> None:
    for name, layers in (("ok.keras", []), ("bad.keras", [LAMBDA_LAYER])):
        with zipfile.ZipFile(tmp_path / name, "w") as z:
            z.writestr("config.json", json.dumps(_keras_config(*layers)))
            z.writestr("metadata.json", json.dumps({"keras_version": "3.3.3"}))
            z.writestr("model.weights.h5", b"\x89HDF\r\n\x1a\n")
    assert scan_file(tmp_path / "ok.keras").clean and scan_file(tmp_path / "ok.keras").format == "keras"
    bad = scan_file(tmp_path / "bad.keras")
    assert bad.severity == "high" and bad.issues[0].where.endswith("config.json")


def test_onnx_custom_ops_and_external_data_outside_the_folder(tmp_path: Path) -> None:
    onnx = pytest.importorskip("onnx", reason="the test builds real ONNX models with the onnx package")
    from onnx import TensorProto, helper

    def model(nodes: list, extra_opsets: tuple = (), init: list | None = None) -> onnx.ModelProto:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])
        g = helper.make_graph(nodes, "g", [x], [y], initializer=init or [])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), *extra_opsets])

    onnx.save(model([helper.make_node("Relu", ["x"], ["y"])]), tmp_path / "ok.onnx")
    custom = model([helper.make_node("Backdoor", ["x"], ["y"], domain="com.evil")],
                   (helper.make_opsetid("com.evil", 1),))
    onnx.save(custom, tmp_path / "custom.onnx")
    w = helper.make_tensor("w", TensorProto.FLOAT, [2], [0.0, 0.0])
    w.data_location = TensorProto.EXTERNAL
    w.ClearField("float_data")
    entry = w.external_data.add()
    entry.key, entry.value = "location", "../../../etc/passwd"
    onnx.save(model([helper.make_node("Add", ["x", "w"], ["y"])], init=[w]), tmp_path / "external.onnx")
    assert scan_file(tmp_path / "ok.onnx").clean and scan_file(tmp_path / "ok.onnx").format == "onnx"
    c = scan_file(tmp_path / "custom.onnx")
    assert c.severity == "medium" and {i.kind for i in c.issues} == {"custom_op"}
    assert any(i.module == "com.evil" and i.name == "Backdoor" for i in c.issues)
    e = scan_file(tmp_path / "external.onnx")
    assert e.severity == "high" and "etc/passwd" in e.issues[0].detail
    (tmp_path / "broken.onnx").write_bytes(b"\x3a\xff\xff\xff\x0f")  # graph field, length past the end
    assert scan_file(tmp_path / "broken.onnx").issues[0].kind == "malformed"


def _pb(number: int, payload: bytes | str) -> bytes:
    """One length-delimited protobuf field (the format spec's wire type 2)."""
    data = payload.encode() if isinstance(payload, str) else payload
    key, n, out = (number << 3) | 2, len(data), bytearray()
    for v in (key, n):
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)
    return bytes(out) + data


def test_tensorflow_saved_model_ops_and_keras_metadata(tmp_path: Path) -> None:
    def saved_model(*ops: str, function_ops: tuple[str, ...] = ()) -> bytes:
        nodes = b"".join(_pb(1, _pb(1, f"n{i}") + _pb(2, op)) for i, op in enumerate(ops))  # GraphDef.node
        fn = _pb(1, _pb(1, _pb(1, "f")) + b"".join(_pb(3, _pb(2, op)) for op in function_ops))  # library.function
        return _pb(2, _pb(2, nodes + _pb(2, fn)))  # SavedModel.meta_graphs → MetaGraphDef.graph_def

    ok, bad = tmp_path / "ok", tmp_path / "bad"
    for d in (ok, bad, ok / "variables"):
        d.mkdir()
    (ok / "saved_model.pb").write_bytes(saved_model("Placeholder", "MatMul", "SaveV2", "RestoreV2"))
    (ok / "variables" / "variables.index").write_bytes(b"\x00\x01")
    (ok / "variables" / "variables.data-00000-of-00001").write_bytes(b"\x00" * 8)
    (bad / "saved_model.pb").write_bytes(saved_model("Placeholder", "ReadFile", "Addons>Evil",
                                                     function_ops=("PyFunc",)))
    (bad / "keras_metadata.pb").write_bytes(_pb(1, _pb(5, json.dumps(LAMBDA_LAYER))))
    assert [s.clean for s in scan_paths([ok])] == [True, True, True]
    scans = {Path(s.path).name: s for s in scan_paths([bad])}
    found = {(i.kind, i.severity, i.name) for i in scans["saved_model.pb"].issues}
    assert found == {("unsafe_op", "high", "ReadFile"), ("custom_op", "medium", "Addons>Evil"),
                     ("unsafe_op", "critical", "PyFunc")}
    assert scans["keras_metadata.pb"].severity == "high"


def _gguf(kv: list[tuple[str, int, bytes]], tensors: int = 0, n_kv: int | None = None) -> bytes:
    """A GGUF v3 header (the format spec: magic, version, tensor count, metadata count, key/type/value)."""
    s = lambda t: struct.pack("<Q", len(t)) + t  # noqa: E731 - a gguf string
    body = b"".join(s(k.encode()) + struct.pack("<I", t) + v for k, t, v in kv)
    return b"GGUF" + struct.pack("<IQQ", 3, tensors, len(kv) if n_kv is None else n_kv) + body + b"\x00" * 32


def test_gguf_header_and_chat_template(tmp_path: Path) -> None:
    name = ("general.name", 8, struct.pack("<Q", 4) + b"tiny")
    safe = ("tokenizer.chat_template", 8, struct.pack("<Q", 33) + b"{% for m in messages %}{{m}}{% en")
    evil_t = b"{{ ''.__class__.__mro__[1].__subclasses__() }}"
    evil = ("tokenizer.chat_template", 8, struct.pack("<Q", len(evil_t)) + evil_t)
    (tmp_path / "ok.gguf").write_bytes(_gguf([name, safe]))
    (tmp_path / "evil.gguf").write_bytes(_gguf([name, evil]))
    (tmp_path / "overflow.gguf").write_bytes(_gguf([name], n_kv=2**62))
    assert scan_file(tmp_path / "ok.gguf").clean and scan_file(tmp_path / "ok.gguf").format == "gguf"
    assert scan_file(tmp_path / "evil.gguf").issues[0].kind == "unsafe_template"
    over = scan_file(tmp_path / "overflow.gguf")
    assert over.severity == "medium" and "overflow" in over.issues[0].detail


def test_scan_cli_counts_every_file_and_strict_fails_on_a_file_not_scanned(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from modelward.cli.main import main

    torch.save({"w": torch.zeros(2)}, tmp_path / "sd.pt")
    (tmp_path / "notes.txt").write_text("trained on digits\n")
    monkeypatch.chdir(tmp_path)
    codes = []
    for extra in ([], ["--strict"]):
        try:
            main(["scan", ".", *extra])
            codes.append(0)
        except SystemExit as e:
            codes.append(int(e.code or 0))
    out = capsys.readouterr().out
    assert codes == [0, 1]
    assert "2 file(s): 1 clean, 0 not clean, 1 not scanned" in out and "notes.txt: not scanned" in out
