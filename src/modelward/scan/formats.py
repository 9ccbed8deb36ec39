"""Model formats besides pickles and safetensors, each examined without loading the model (issue 38 item 6).

- **Keras HDF5** (``.h5``, ``.hdf5``; HDF5 signature): the ``model_config`` attribute (the Keras JSON config) is
  read with h5py (``modelward[scan]``); a ``Lambda`` layer anywhere in it, nested models included, is *high*: its
  ``function`` is marshalled Python bytecode (or a named function) that ``tf.keras`` runs when it loads the file
  (CVE-2024-3660 before Keras 2.13; Keras 3 only with ``safe_mode=False``). ModelScan reports the same top-level
  layers as MEDIUM. A layer class from a module outside Keras/TensorFlow is *medium* (that module is imported on
  loading). Without h5py the file is reported *not scanned*, never skipped.
- **Keras v3** (``.keras``: a zip with ``config.json``): the same checks on ``config.json``; the zip's other members
  go through the pickle/zip scan as before.
- **ONNX** (``.onnx``; a ``ModelProto``): every node's operator domain is read with a small protobuf reader (no onnx
  package needed). A domain other than the standard ones (``""``/``ai.onnx``, ``ai.onnx.ml``, ``ai.onnx.training``,
  ``ai.onnx.preview.training``) or ONNX Runtime's built-in ``com.microsoft`` is a *custom op* (*medium*: the runtime
  must load a native library that provides it). A tensor whose data is *external* with an absolute or ``..`` path
  is *high* (it reads a file outside the model's folder when loaded; CVE-2024-27318/-27319 in onnx).
- **TensorFlow SavedModel** (``saved_model.pb``): the op of every node of every graph and function is read. File
  access (``ReadFile``, ``WriteFile``, ``MatchingFiles``; ModelScan: HIGH) is *high*, Python callbacks (``PyFunc``,
  ``PyFuncStateless``, ``EagerPyFunc``) *critical*, a namespaced op (``Namespace>Op``, TensorFlow's convention for
  ops from custom libraries) a *custom op* at *medium*. A custom op registered without a namespace cannot be told
  from a core op without TensorFlow's op registry: that is not detected. ``keras_metadata.pb`` (beside it) is searched for Keras
  Lambda layers as above; a bare frozen ``GraphDef`` (``*.pb``) gets the same op checks. The ``variables/`` files and ``fingerprint.pb`` hold data only.
- **GGUF** (``GGUF`` magic): the header is parsed with every count and length checked against the file (a header
  crafted to overflow a reader is *medium*, malformed), tensors must have at most 4 dimensions and lie inside the
  file, and a ``tokenizer.chat_template`` with Python attribute tricks (``__class__``, ``__globals__``, ...; the
  Jinja2 template injection of CVE-2024-34359 in llama-cpp-python) is *high*.

Each reader returns :class:`~modelward.scan.result.ScanIssue` s; nothing here imports, unpickles or runs the model.
"""

from __future__ import annotations

import json
import re
import struct
import zipfile
from pathlib import Path
from typing import IO, Any

from modelward.scan.protobuf import ProtobufError, string, submessages
from modelward.scan.result import ScanIssue

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
GGUF_MAGIC = b"GGUF"
ONNX_STANDARD_DOMAINS = {"", "ai.onnx", "ai.onnx.ml", "ai.onnx.training", "ai.onnx.preview.training"}
ONNX_KNOWN_RUNTIME_DOMAINS = {"com.microsoft", "com.microsoft.nchwc", "com.microsoft.mlfeaturizers"}
TF_FILE_OPS = {"ReadFile", "WriteFile", "MatchingFiles"}
TF_PYTHON_OPS = {"PyFunc", "PyFuncStateless", "EagerPyFunc"}
MAX_CONFIG = 64 * 2**20  # a Keras config larger than this is not parsed (an issue instead)
_KERAS_MODULES = ("keras", "tensorflow", "tf_keras")
_DUNDER = re.compile(r"__(class|globals|subclasses|builtins|import|init|mro|bases|base|getattribute|code|reduce)__")


# -- Keras -----------------------------------------------------------------------------------------------------
def keras_config_issues(config: Any, where: str) -> list[ScanIssue]:
    """Lambda layers and layer classes from outside Keras anywhere in a Keras model config (nested models too)."""
    out: list[ScanIssue] = []
    stack = [config]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            cls = node.get("class_name")
            name = node.get("config", {}).get("name", "?") if isinstance(node.get("config"), dict) else "?"
            if cls == "Lambda":
                out.append(ScanIssue(where, "unsafe_layer", "high",
                                     f"Keras Lambda layer {name!r}: its function (marshalled Python bytecode or a "
                                     "named function) runs when the model is loaded (tf.keras < 2.13, or Keras 3 with "
                                     "safe_mode=False)", "keras.layers", "Lambda"))
            module = node.get("module")
            if isinstance(cls, str) and isinstance(module, str) and module and not module.startswith(_KERAS_MODULES):
                out.append(ScanIssue(where, "unsafe_layer", "medium",
                                     f"Keras object {cls!r} from module {module!r}: that module is imported and its "
                                     "code runs when the model is loaded", module, cls))
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return out


def _keras_json(text: str | bytes, where: str) -> list[ScanIssue]:
    if len(text) > MAX_CONFIG:
        return [ScanIssue(where, "malformed", "medium", f"Keras config of {len(text)} bytes (over the scan limit)")]
    try:
        return keras_config_issues(json.loads(text), where)
    except (ValueError, UnicodeDecodeError) as e:
        return [ScanIssue(where, "malformed", "medium", f"the Keras config is not JSON ({e})")]


def scan_hdf5(path: Path) -> tuple[str, list[ScanIssue]]:
    """An HDF5 file: a Keras model (``model_config`` attribute) is checked for Lambda layers; other HDF5 files hold
    data only (h5py reads attributes and datasets; HDF5 itself has no code path)."""
    try:
        import h5py
    except ImportError:
        return "hdf5", [ScanIssue(str(path), "not_scanned", "medium", "not scanned: an HDF5 file (a Keras .h5 "
                                  "model?) needs h5py to be read: pip install 'modelward[scan]'")]
    try:
        with h5py.File(path, "r") as f:
            raw = f.attrs.get("model_config")
    except (OSError, ValueError) as e:
        return "hdf5", [ScanIssue(str(path), "malformed", "medium", f"not a readable HDF5 file ({e})")]
    if raw is None:
        return "hdf5", []
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    return "keras_h5", _keras_json(str(raw), f"{path}:model_config")


def keras_zip_issues(z: zipfile.ZipFile, where: str) -> list[ScanIssue]:
    """A Keras v3 ``.keras`` archive's ``config.json``."""
    info = z.getinfo("config.json")
    if info.file_size > MAX_CONFIG:
        return [ScanIssue(f"{where}:config.json", "malformed", "medium", "config.json over the scan limit")]
    return _keras_json(z.read(info), f"{where}:config.json")


# -- ONNX ------------------------------------------------------------------------------------------------------
def _onnx_graph(graph: bytes, where: str, out: list[ScanIssue], seen: set[str], depth: int) -> None:
    if depth > 32:
        out.append(ScanIssue(where, "malformed", "medium", "ONNX subgraphs nested more than 32 deep"))
        return
    for node in submessages(graph, 1):  # GraphProto.node
        domain, op = string(node, 7), string(node, 4)  # NodeProto.domain, NodeProto.op_type
        if (domain not in ONNX_STANDARD_DOMAINS and domain not in ONNX_KNOWN_RUNTIME_DOMAINS
                and f"{domain}::{op}" not in seen):
            seen |= {domain, f"{domain}::{op}"}
            out.append(ScanIssue(where, "custom_op", "medium", f"ONNX custom op {domain}::{op}: the runtime must load "
                                 "a native library providing this domain (native code runs with the model)",
                                 domain, op))
        for attr in submessages(node, 5):  # NodeProto.attribute: If / Loop / Scan bodies are graphs
            for sub in submessages(attr, 6) + submessages(attr, 11):  # AttributeProto.g, .graphs
                _onnx_graph(sub, where, out, seen, depth + 1)
    for tensor in submessages(graph, 5):  # GraphProto.initializer
        for entry in submessages(tensor, 13):  # TensorProto.external_data (key/value)
            if string(entry, 1) == "location":
                loc = string(entry, 2)
                if loc.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", loc) or ".." in Path(loc).parts:
                    out.append(ScanIssue(where, "external_data", "high",
                                         f"tensor {string(tensor, 8)!r} reads its data from {loc!r}, outside the "
                                         "model's folder, when the model is loaded"))


def scan_onnx(path: Path) -> tuple[str, list[ScanIssue]]:
    """An ONNX ``ModelProto``: custom-op domains (opset imports and nodes, subgraphs included) and external data
    paths outside the model's folder."""
    where = str(path)
    try:
        model = path.read_bytes()
        graphs = submessages(model, 7)  # ModelProto.graph
        if not graphs:
            return "unknown", []
        out: list[ScanIssue] = []
        seen: set[str] = set()  # custom domains, and domain::op pairs, already reported
        for g in graphs:
            _onnx_graph(g, where, out, seen, 0)
        for fn in submessages(model, 25):  # ModelProto.functions: FunctionProto.node = 7
            _onnx_graph(b"".join(b"\x0a" + _len(n) + n for n in submessages(fn, 7)), where, out, seen, 1)
        for opset in submessages(model, 8):  # ModelProto.opset_import: OperatorSetIdProto.domain = 1
            d = string(opset, 1)
            if d not in ONNX_STANDARD_DOMAINS and d not in ONNX_KNOWN_RUNTIME_DOMAINS and d not in seen:
                out.append(ScanIssue(where, "custom_op", "medium", f"ONNX opset of custom domain {d!r}: the runtime "
                                     "must load a native library providing it", d, ""))
    except ProtobufError as e:
        return "onnx", [ScanIssue(where, "malformed", "medium", f"not a well-formed ONNX protobuf ({e})")]
    return "onnx", out


def _len(b: bytes) -> bytes:
    """A protobuf varint of len(b) (to rewrap a FunctionProto's nodes as a GraphProto's)."""
    n, out = len(b), bytearray()
    while True:
        if n < 0x80:
            out.append(n)
            return bytes(out)
        out.append((n & 0x7F) | 0x80)
        n >>= 7


# -- TensorFlow SavedModel --------------------------------------------------------------------------------------
def _tf_ops(graph_def: bytes) -> set[str]:
    ops = {string(n, 2) for n in submessages(graph_def, 1)}  # GraphDef.node: NodeDef.op = 2
    for lib in submessages(graph_def, 2):  # GraphDef.library: FunctionDefLibrary.function = 1
        for fn in submessages(lib, 1):
            ops |= {string(n, 2) for n in submessages(fn, 3)}  # FunctionDef.node_def = 3
    return ops


def tf_op_issues(ops: set[str], where: str) -> list[ScanIssue]:
    """Python callbacks, file access and namespaced custom ops among a TensorFlow graph's op names."""
    out = []
    for op in sorted(ops):
        if op in TF_PYTHON_OPS:
            out.append(ScanIssue(where, "unsafe_op", "critical", f"TensorFlow op {op}: calls back into Python code "
                                 "registered in the loading process", "tensorflow", op))
        elif op in TF_FILE_OPS:
            out.append(ScanIssue(where, "unsafe_op", "high", f"TensorFlow op {op}: reads or writes files when the "
                                 "graph runs", "tensorflow", op))
        elif ">" in op:
            out.append(ScanIssue(where, "custom_op", "medium", f"TensorFlow custom op {op}: the runtime must load the "
                                 "native library that registers it", op.split(">")[0], op))
    return out


def scan_saved_model(path: Path) -> tuple[str, list[ScanIssue]]:
    """``saved_model.pb``: a SavedModel (meta_graphs = 2 → graph_def = 2), every graph's and function's ops."""
    try:
        ops: set[str] = set()
        for meta in submessages(path.read_bytes(), 2):
            for graph in submessages(meta, 2):
                ops |= _tf_ops(graph)
    except ProtobufError as e:
        return "tf_savedmodel", [ScanIssue(str(path), "malformed", "medium", f"not a well-formed SavedModel ({e})")]
    return "tf_savedmodel", tf_op_issues(ops, str(path))


def scan_tf_graph(path: Path) -> tuple[str, list[ScanIssue]]:
    """A bare ``GraphDef`` (a frozen graph, ``*.pb``); ``unknown`` when it holds no node with an op."""
    try:
        ops = _tf_ops(path.read_bytes()) - {""}
    except ProtobufError:
        return "unknown", []
    return ("tf_graph", tf_op_issues(ops, str(path))) if ops else ("unknown", [])


def keras_metadata_issues(path: Path) -> list[ScanIssue]:
    """``keras_metadata.pb``: SavedMetadata.nodes (1) → SavedObject.metadata (5), one JSON document per layer."""
    out: list[ScanIssue] = []
    try:
        for node in submessages(path.read_bytes(), 1):
            meta = string(node, 5)
            if meta:
                out += _keras_json(meta, str(path))
    except ProtobufError as e:
        out.append(ScanIssue(str(path), "malformed", "medium", f"not a well-formed keras_metadata.pb ({e})"))
    return out


# -- GGUF ------------------------------------------------------------------------------------------------------
class _GGUFError(ValueError):
    pass


class _Reader:
    def __init__(self, f: IO[bytes], size: int) -> None:
        self.f, self.size = f, size

    def take(self, n: int) -> bytes:
        if n < 0 or self.f.tell() + n > self.size:
            raise _GGUFError(f"a length of {n} bytes runs past the end of the file (byte {self.f.tell()})")
        return self.f.read(n)

    def u32(self) -> int:
        return int(struct.unpack("<I", self.take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack("<Q", self.take(8))[0])

    def string(self) -> str:
        return self.take(self.u64()).decode("utf-8", "replace")


_GGUF_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # type -> bytes


def _gguf_value(r: _Reader, vtype: int, depth: int = 0) -> Any:
    if vtype in _GGUF_SCALAR:
        return r.take(_GGUF_SCALAR[vtype])
    if vtype == 8:
        return r.string()
    if vtype == 9 and depth < 2:
        etype, count = r.u32(), r.u64()
        if etype in _GGUF_SCALAR:
            r.take(count * _GGUF_SCALAR[etype])
            return None
        if count > r.size:  # each element takes at least one byte
            raise _GGUFError(f"an array of {count} elements in a file of {r.size} bytes")
        for _ in range(count):
            _gguf_value(r, etype, depth + 1)
        return None
    raise _GGUFError(f"unknown value type {vtype}")


def scan_gguf(path: Path) -> tuple[str, list[ScanIssue]]:
    """A GGUF header (v1–v3): counts, strings and tensor descriptions within the file; the chat template."""
    where = str(path)
    size = path.stat().st_size
    out: list[ScanIssue] = []
    with path.open("rb") as f:
        r = _Reader(f, size)
        try:
            r.take(4)
            version = r.u32()
            if version not in (1, 2, 3):
                raise _GGUFError(f"unknown GGUF version {version}")
            n_tensors = r.u32() if version == 1 else r.u64()
            n_kv = r.u32() if version == 1 else r.u64()
            if n_tensors > size // 24 or n_kv > size // 12:  # every entry takes at least that many bytes
                raise _GGUFError(f"header claims {n_tensors} tensors and {n_kv} metadata entries in {size} bytes "
                                 "(a header crafted to overflow a reader)")
            alignment = 32
            for _ in range(n_kv):
                key = r.string()
                vtype = r.u32()
                value = _gguf_value(r, vtype)
                if key == "general.alignment" and isinstance(value, bytes) and len(value) == 4:
                    alignment = max(1, int.from_bytes(value, "little"))
                if key == "tokenizer.chat_template" and isinstance(value, str):
                    hit = _DUNDER.search(value)
                    if hit:
                        out.append(ScanIssue(where, "unsafe_template", "high",
                                             f"the chat template reaches Python internals ({hit.group(0)}): Jinja2 "
                                             "template injection runs code where the template is rendered "
                                             "(CVE-2024-34359)"))
            spans = []
            for _ in range(n_tensors):
                name = r.string()
                n_dims = r.u32()
                if n_dims > 4:
                    raise _GGUFError(f"tensor {name!r} has {n_dims} dimensions (GGML allows 4)")
                dims = [r.u64() for _ in range(n_dims)]
                r.u32()  # ggml type
                offset = r.u64()
                count = 1
                for d in dims:
                    count *= d
                if count > size * 8:  # even at 1 bit per element it would not fit
                    raise _GGUFError(f"tensor {name!r} of shape {dims} cannot fit in {size} bytes")
                spans.append((name, offset))
            data_start = -(-f.tell() // alignment) * alignment
            for name, offset in spans:
                if data_start + offset > size:
                    raise _GGUFError(f"tensor {name!r} starts at byte {data_start + offset}, past the end")
        except (_GGUFError, struct.error) as e:
            out.append(ScanIssue(where, "malformed", "medium", f"GGUF header: {e}"))
    return "gguf", out
