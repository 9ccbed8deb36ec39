"""Text models behind the guard: the Open Inference Protocol's INT64 token ids and BYTES strings
(extraction/guard/oip.py TextInput) parsed, padded and checked; what a hostile client sends is refused with a 4xx
code before the model runs; a served Hugging Face classifier answers BYTES requests."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from modelward.extraction.guard.errors import GuardError
from modelward.extraction.guard.oip import InferRequest, TextInput, model_metadata


def _body(data: object, shape: list[int], datatype: str = "INT64", **tensor: object) -> bytes:
    t = {"name": "input", "shape": shape, "datatype": datatype, **tensor}
    if data is not None:
        t["data"] = data
    return json.dumps({"inputs": [t]}).encode()


INT = TextInput("INT64", pad_id=0, vocab_size=50)


def test_int64_ids_are_padded_to_the_model_length():
    req = InferRequest.parse(_body([[2, 7, 3], [2, 9, 3]], [2, 3]), None, (6,), 8, INT)
    assert req.x.tolist() == [[2, 7, 3, 0, 0, 0], [2, 9, 3, 0, 0, 0]]
    blob = struct.pack("<3q", 2, 7, 3)
    head = json.dumps({"inputs": [{"name": "input", "shape": [1, 3], "datatype": "INT64",
                                   "parameters": {"binary_data_size": len(blob)}}]}).encode()
    assert InferRequest.parse(head + blob, str(len(head)), (6,), 8, INT).x.tolist() == [[2, 7, 3, 0, 0, 0]]


@pytest.mark.parametrize("body,code", [
    (_body([[2, 7.5, 3]], [1, 3]), "bad_data"),  # a float is not a token id
    (_body([[2, True, 3]], [1, 3]), "bad_data"),
    (_body([[2, 50, 3]], [1, 3]), "bad_data"),  # outside the vocabulary: the embedding would fail (a 500)
    (_body([[2, -1, 3]], [1, 3]), "bad_data"),
    (_body([[1] * 7], [1, 7]), "bad_shape"),  # longer than the model reads
    (_body([[2, 7]], [1, 3]), "bad_shape"),
    (_body([[2, 7, 3]], [1, 3], "FP32"), "bad_datatype"),
    (_body(["the match"], [1], "BYTES"), "bad_datatype"),
])
def test_hostile_int64_requests_are_refused(body, code):
    with pytest.raises(GuardError) as e:
        InferRequest.parse(body, None, (6,), 8, INT)
    assert e.value.code == code


def test_bytes_strings_are_tokenized_and_bad_ones_refused():
    seen: list[list[str]] = []

    def tokenize(texts: list[str]) -> np.ndarray:  # a stand-in tokenizer: fixed ids, right-padded
        seen.append(texts)
        return np.array([[2, 11, 3, 0], [2, 12, 13, 3]][: len(texts)])

    text = TextInput("BYTES", pad_id=0, vocab_size=50, tokenize=tokenize)
    req = InferRequest.parse(_body(["a b", "c"], [2], "BYTES"), None, (6,), 8, text)
    assert seen == [["a b", "c"]] and req.x.tolist() == [[2, 11, 3, 0, 0, 0], [2, 12, 13, 3, 0, 0]]
    elems = b"".join(struct.pack("<I", len(s)) + s for s in (b"a b",))
    head = json.dumps({"inputs": [{"name": "input", "shape": [1], "datatype": "BYTES",
                                   "parameters": {"binary_data_size": len(elems)}}]}).encode()
    assert InferRequest.parse(head + elems, str(len(head)), (6,), 8, text).x.shape == (1, 6)
    for bad in (_body([1, 2], [2], "BYTES"), _body(["x"], [2], "BYTES"), _body(["x" * 70000], [1], "BYTES")):
        with pytest.raises(GuardError, match="strings|longer"):
            InferRequest.parse(bad, None, (6,), 8, text)
    broken = struct.pack("<I", 99) + b"short"
    head = json.dumps({"inputs": [{"name": "input", "shape": [1], "datatype": "BYTES",
                                   "parameters": {"binary_data_size": len(broken)}}]}).encode()
    with pytest.raises(GuardError, match="runs past"):
        InferRequest.parse(head + broken, str(len(head)), (6,), 8, text)


def test_metadata_names_the_text_input():
    meta = model_metadata("m", (32,), 3, "modelguard_s", 64, "BYTES")
    assert meta["inputs"][0] == {"name": "input", "datatype": "BYTES", "shape": [-1]}
    assert meta["parameters"]["max_tokens"] == 32
    assert model_metadata("m", (1, 8, 8), 10, "none", 64)["inputs"][0]["shape"] == [-1, 1, 8, 8]


def test_a_served_hugging_face_classifier_answers_bytes_requests(tmp_path):
    pytest.importorskip("transformers", reason="the text extra (transformers) is not installed")
    import importlib.util

    from modelward.core.zoo import ModelConfig, build_model
    from modelward.extraction.guard.service import build_service

    root = __import__("pathlib").Path(__file__).resolve().parents[3]
    spec = importlib.util.spec_from_file_location("text_prepare_guard", root / "examples/text_classifier/prepare.py")
    prepare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prepare)
    folder = tmp_path / "model"
    tok = prepare.tokenizer(folder)
    net = build_model(ModelConfig(source="hf", kwargs={"model_type": "bert", "vocab_size": tok.vocab_size,
                                                        "hidden_size": 16, "num_hidden_layers": 1,
                                                        "num_attention_heads": 2, "intermediate_size": 32,
                                                        "max_position_embeddings": 32}), (16,), 3)
    net.hf.save_pretrained(folder)
    (tmp_path / "guard.toml").write_text(
        '[server]\nstate_dir = "state"\n[model]\nname = "topics"\ncheckpoint = "model/model.safetensors"\n'
        'input_shape = [16]\nnum_classes = 3\ninput_datatype = "BYTES"\ntokenizer = "model"\n'
        '[model.net]\nsource = "hf"\npath = "model"\n[[keys]]\nname = "alice"\nkey = "alice-secret-key-1"\n')
    svc = build_service(tmp_path / "guard.toml")
    try:
        key = svc.keys["alice-secret-key-1"]
        answer = svc.handle(key, _body(["the striker scored a goal", "rain and wind"], [2], "BYTES"), None)
        probs = np.array(json.loads(answer.body)["outputs"][0]["data"]).reshape(2, 3)
        assert np.allclose(probs.sum(1), 1.0, atol=1e-5) and answer.rows == 2
        with pytest.raises(GuardError, match="datatype must be 'BYTES'"):
            svc.handle(key, _body([[2, 5, 3]], [1, 3]), None)
        assert svc.metadata()["inputs"][0]["datatype"] == "BYTES"
    finally:
        svc.close()
