"""The FP32 codec's refusal of JSON booleans after guard-perf3's cheaper search for ``true`` / ``false`` (a one-byte
search first): the same bodies refused and accepted as with the plain search."""

from __future__ import annotations

import json

import pytest

from modelward.extraction.guard.errors import GuardError
from modelward.extraction.guard.oip import InferRequest, _may_hold_bool


def _body(data, **extra) -> bytes:
    return json.dumps({"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": data}],
                       **extra}).encode()


BOOLS = [_body([0.5, True, 0.1, 0.2]), _body([[0.5, 0.1], [0.2, False]]), _body([0.5, 0.1, 0.2, True], id="r-l"),
         _body([False, 0.1, 0.2, 0.3], parameters={"note": "true story"})]
FINE = [_body([0.5, 1, 0.1, 0.2]), _body([0.5, 0.1, 0.2, 0.3], parameters={"flag": "true", "other": "false"}),
        _body([0.5, 0.1, 0.2, 0.3], id="rl"), _body([0.5, 0.1, 0.2, 0.3], parameters={"binary_data_output": False})]


@pytest.mark.parametrize("body", BOOLS)
def test_booleans_in_the_data_are_refused(body):
    with pytest.raises(GuardError) as e:
        InferRequest.parse(body, None, (4,), 8)
    assert e.value.code == "bad_data"


@pytest.mark.parametrize("body", FINE)
def test_numbers_are_accepted_whatever_the_rest_of_the_body_says(body):
    assert InferRequest.parse(body, None, (4,), 8).x.shape == (1, 4)


def test_the_cheap_search_says_what_the_plain_one_says():
    for body in [*BOOLS, *FINE, b"", b"r", b"l", b"tru", b"fals", b"xtruex", b"falsefalse", b"rl", b"true", b"false"]:
        assert _may_hold_bool(body) == (b"true" in body or b"false" in body), body
