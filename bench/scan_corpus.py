"""The scanner on a folder of hostile and plain model files of every format it reads (issue 38 item 6).

Writes ``bad/`` (pickles that run code, a PyTorch zip inside a zip, a Keras .h5 and a .keras with a Lambda layer,
ONNX models with a custom-op domain and with external data outside the folder, a SavedModel with ReadFile and a
namespaced custom op, a GGUF whose chat template reaches Python internals) and ``good/`` (state dicts, safetensors,
a Keras .h5 without Lambda, a plain ONNX model, a SavedModel's variables, a clean GGUF, a README), then runs
``modelward scan bad good`` and ``--strict`` in this process and prints what each file got, the totals, the exit
codes, and how many files the former suffix filter of the folder walk would have kept.

Usage::

    PYTHONPATH=src python bench/scan_corpus.py --out runs/scan_corpus

Needs picklescan and h5py (``modelward[scan]``) and the onnx package (to write the ONNX files).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import struct
import zipfile
from pathlib import Path

import torch
from safetensors.torch import save_file

OLD_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl", ".pickle", ".joblib", ".safetensors", ".zip", ".npy",
                ".npz", ".mar", ".tar")  # what the folder walk kept before issue 38


class _Reduce:
    def __init__(self, fn: object, args: tuple) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple:
        return (self.fn, self.args)


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for k, v in members.items():
            z.writestr(k, v)
    return buf.getvalue()


def _pb(number: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    out = bytearray()
    for v in ((number << 3) | 2, len(data)):
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)
    return bytes(out) + data


def _gguf(template: bytes) -> bytes:
    kv = b"".join(struct.pack("<Q", len(k)) + k + struct.pack("<I", 8) + struct.pack("<Q", len(v)) + v
                  for k, v in ((b"general.name", b"tiny"), (b"tokenizer.chat_template", template)))
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + kv + b"\x00" * 32


def _keras(lam: bool) -> dict:
    layers = [{"class_name": "Dense", "config": {"name": "d", "units": 2}}]
    if lam:
        layers.append({"class_name": "Lambda", "config": {"name": "evil", "function": ["4wEAAAAA", None, None]}})
    return {"class_name": "Sequential", "config": {"name": "m", "layers": layers}}


def _h5(path: Path, config: dict) -> None:
    import h5py

    with h5py.File(path, "w") as f:
        f.attrs["model_config"] = json.dumps(config)
        f.create_dataset("w", data=[0.0, 1.0])


def _onnx(path: Path, domain: str = "", external: str | None = None) -> None:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    init = []
    if external:
        w = helper.make_tensor("w", TensorProto.FLOAT, [2], [0.0, 0.0])
        w.data_location = TensorProto.EXTERNAL
        w.ClearField("float_data")
        e = w.external_data.add()
        e.key, e.value = "location", external
        init.append(w)
    node = helper.make_node("Op" if domain else "Relu", ["x"], ["y"], domain=domain)
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    onnx.save(helper.make_model(helper.make_graph([node], "g", [x], [y], initializer=init), opset_imports=opsets),
              path)


def build(root: Path) -> tuple[Path, Path]:
    bad, good = root / "bad", root / "good"
    for d in (bad, good, bad / "savedmodel", good / "savedmodel" / "variables"):
        d.mkdir(parents=True, exist_ok=True)
    (bad / "os_system.pkl").write_bytes(pickle.dumps(_Reduce(os.system, ("echo pwned",))))
    (bad / "eval.bin").write_bytes(b"cbuiltins\neval\n(S'1+1'\ntR.")
    torch.save({"w": torch.zeros(2), "x": _Reduce(os.system, ("echo pwned",))}, bad / "torch_zip.pt")
    (bad / "nested.zip").write_bytes(_zip({"inner.zip": _zip({"m.pt": (bad / "torch_zip.pt").read_bytes()})}))
    _h5(bad / "lambda.h5", _keras(True))
    (bad / "lambda.keras").write_bytes(_zip({"config.json": json.dumps(_keras(True)).encode(),
                                             "metadata.json": b"{}"}))
    _onnx(bad / "custom_op.onnx", domain="com.evil")
    _onnx(bad / "external.onnx", external="../../../etc/passwd")
    graph = _pb(1, _pb(1, "r") + _pb(2, "ReadFile")) + _pb(1, _pb(1, "c") + _pb(2, "Addons>Evil"))
    (bad / "savedmodel" / "saved_model.pb").write_bytes(_pb(2, _pb(2, graph)))
    (bad / "template.gguf").write_bytes(_gguf(b"{{ ''.__class__.__mro__[1].__subclasses__() }}"))
    torch.manual_seed(0)
    for i in range(3):
        m = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        torch.save(m.state_dict(), good / f"sd{i}.pt")
        save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(good / f"sd{i}.safetensors"))
    _h5(good / "plain.h5", _keras(False))
    _onnx(good / "relu.onnx")
    (good / "savedmodel" / "saved_model.pb").write_bytes(_pb(2, _pb(2, _pb(1, _pb(1, "m") + _pb(2, "MatMul")))))
    (good / "savedmodel" / "variables" / "variables.index").write_bytes(b"\x00")
    (good / "chat.gguf").write_bytes(_gguf(b"{% for m in messages %}{{ m['content'] }}{% endfor %}"))
    (good / "README.md").write_text("# the weights of our model\n")
    return bad, good


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/scan_corpus"))
    args = ap.parse_args()
    from modelward.cli.main import main as cli
    from modelward.scan import scan_paths

    bad, good = build(args.out.resolve())
    files = sorted(p for d in (bad, good) for p in d.rglob("*") if p.is_file())
    for s in scan_paths([bad, good]):
        state = "clean" if s.clean else "not scanned" if not s.scanned else s.severity
        print(f"  {Path(s.path).relative_to(args.out.resolve())}: {state} ({s.format})"
              + (f" — {s.issues[0].detail[:90]}" if s.issues else ""))
    print(f"{len(files)} files on disk; the former suffix filter walked "
          f"{sum(p.suffix in OLD_SUFFIXES for p in files)}")
    os.chdir(args.out.resolve())
    for extra in ([], ["--strict"]):
        try:
            cli(["scan", "bad", "good", *extra])
            code = 0
        except SystemExit as e:
            code = int(e.code or 0)
        print(f"modelward scan bad good {' '.join(extra)}: exit {code}")


if __name__ == "__main__":
    main()
