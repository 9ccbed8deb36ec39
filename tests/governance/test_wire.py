import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from modelward.governance.wire import (
    MAGIC,
    InOrder,
    Message,
    SequenceGuard,
    WireError,
    decode,
    encode,
    expect,
)


@pytest.mark.parametrize("t", [torch.randn(3, 4), torch.tensor(1.5), torch.zeros(0, 3), torch.ones(2, dtype=torch.bool),
                               torch.randn(2, 2).bfloat16(), torch.arange(5), torch.randn(2, 1, 3).double()])
def test_roundtrip_keeps_dtype_shape_and_values(t):
    m = decode(encode(Message("forward", "s", 7, 3, {"purpose": "train"}, {"a": t})))
    assert (m.op, m.session, m.step, m.seq, m.meta) == ("forward", "s", 7, 3, {"purpose": "train"})
    assert m.tensors["a"].dtype == t.dtype and m.tensors["a"].shape == t.shape and torch.equal(m.tensors["a"], t)


def _with_header(header: bytes, body: bytes = b"") -> bytes:
    return MAGIC + struct.pack("<I", len(header)) + header + body


@pytest.mark.parametrize("data,needle", [
    (b"GET / HTTP/1.1", "bad magic"),
    (_with_header(b"{not json"), "not valid JSON"),
    (_with_header(b'{"op":"f","tensors":[{"name":"h","dtype":"object","shape":[1],"nbytes":8}]}', b"x" * 8),
     "dtype 'object' not allowed"),
    (_with_header(b'{"op":"f","tensors":[{"name":"h","dtype":"float32","shape":[2],"nbytes":4}]}', b"x" * 4),
     "needs 8"),
    (_with_header(b'{"op":"f","tensors":[{"name":"h","dtype":"float32","shape":[99999,99999],'
                  b'"nbytes":39999200004}]}'), "truncated"),
    (_with_header(b'{"op":"f","step":-1}'), "non-negative"),
    (_with_header(b'{"op":"f"}', b"extra"), "trailing"),
])
def test_malformed_messages_are_refused_with_a_reason(data, needle):
    with pytest.raises(WireError, match=needle):
        decode(data)


def test_nonfinite_oversized_and_wrong_shape_refused():
    with pytest.raises(WireError, match="NaN or Inf"):
        decode(encode(Message("f", tensors={"h": torch.tensor([1.0, float("nan")])})))
    with pytest.raises(WireError, match="exceeds the limit"):
        decode(encode(Message("f", tensors={"h": torch.zeros(1000)})), max_bytes=1000)
    m = decode(encode(Message("f", tensors={"h": torch.zeros(4, 3)})))
    with pytest.raises(WireError, match="expected B×5"):
        expect(m, "h", torch.float32, (None, 5))
    with pytest.raises(WireError, match="expected float64"):
        expect(m, "h", torch.float64)
    with pytest.raises(WireError, match="batch of 4 exceeds"):
        expect(m, "h", torch.float32, (None, 3), max_batch=2)


def test_sequence_guard_detects_replay_gap_and_answers_retries():
    g = SequenceGuard()
    assert g.check("p", "s", 1, b"a") is None
    g.commit("p", "s", 1, b"a", b"resp1")
    assert g.check("p", "s", 1, b"a") == b"resp1"  # identical retry
    with pytest.raises(WireError, match="replayed"):
        g.check("p", "s", 1, b"different")
    with pytest.raises(WireError, match="out-of-order"):
        g.check("p", "s", 3, b"c")
    assert g.check("p", "s", 2, b"b") is None
    assert len(SequenceGuard(2).last) == 0


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_fuzz_random_bytes_never_crash_the_decoder(data):
    try:
        decode(data)
    except WireError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=64), st.integers(0, 200))
def test_fuzz_corrupted_valid_messages(noise, pos):
    good = bytearray(encode(Message("forward", "s", 1, 1, {"k": 1}, {"h": torch.randn(2, 3)})))
    pos = min(pos, len(good) - 1)
    bad = bytes(good[:pos]) + noise + bytes(good[pos + len(noise):])
    try:
        m = decode(bad)
    except WireError:
        return
    for t in m.tensors.values():  # anything accepted is well-formed
        assert t.numel() * t.element_size() <= len(bad)


def test_finite_check_is_exact_when_the_sum_overflows_and_for_every_float_dtype():
    from modelward.governance.wire import all_finite

    big = torch.full((8,), 3e38)  # every value finite, their float32 sum is inf: the exact check must decide
    assert all_finite(big)
    assert decode(encode(Message("f", tensors={"h": big}))).tensors["h"].equal(big)
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        for bad in (float("inf"), float("-inf"), float("nan")):
            t = torch.zeros(1000, dtype=dtype)
            t[537] = bad
            assert not all_finite(t)
            with pytest.raises(WireError, match="NaN or Inf"):
                decode(encode(Message("f", tensors={"h": t})))
        both = torch.tensor([float("inf"), float("-inf")], dtype=dtype)  # sums to nan, still refused
        assert not all_finite(both)


def test_decode_accepts_any_byte_buffer_and_returns_writable_tensors():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    data = encode(Message("f", tensors={"h": t}))
    for buf in (data, bytearray(data), memoryview(data)):
        h = decode(buf).tensors["h"]
        assert h.equal(t)
        h.add_(1)  # owns its memory: the message buffer is untouched
    assert decode(data).tensors["h"].equal(t)


def test_channels_last_batches_travel_in_their_own_memory_order():
    h = torch.randn(3, 5, 4, 2).contiguous(memory_format=torch.channels_last)
    raw = encode(Message("step", tensors={"h": h, "x": torch.randn(3, 5, 4, 2), "one": torch.randn(3, 1, 4, 2)}))
    assert b'"layout":"channels_last"' in raw and raw.count(b"channels_last") == 1  # only the real one
    m = decode(raw)
    got = m.tensors["h"]
    assert torch.equal(got, h) and got.shape == h.shape
    assert got.is_contiguous(memory_format=torch.channels_last) and not got.is_contiguous()  # no conversion
    assert m.tensors["x"].is_contiguous() and torch.equal(m.tensors["x"], decode(raw).tensors["x"])
    # the bytes are the tensor's memory order (N, H, W, C)
    assert raw.endswith(m.tensors["one"].numpy().tobytes())
    assert h.permute(0, 2, 3, 1).contiguous().numpy().tobytes() in raw


@pytest.mark.parametrize("layout,shape", [("channels_first", [1, 2, 2, 2]), ("channels_last", [2, 4]),
                                          (["channels_last"], [1, 2, 2, 2])])
def test_bad_layouts_are_refused(layout, shape):
    import json

    n = 4 * int(torch.tensor(shape).prod())
    header = json.dumps({"op": "f", "tensors": [{"name": "h", "dtype": "float32", "shape": shape, "nbytes": n,
                                                 "layout": layout}]}).encode()
    with pytest.raises(WireError, match="layout"):
        decode(_with_header(header, b"\0" * n))


def test_in_order_holds_a_request_that_overtook_its_predecessor_and_nothing_else():
    """A pipelining caller's step s+1 may reach a worker thread before step s: it waits for s to be accepted or
    refused, then meets the sequence guard as usual. A caller cannot use the wait to hold threads: only a
    (peer, session) with a finished request waits, at most `max_waiting` requests wait, none longer than `wait_s`,
    and a refused request far ahead releases nobody."""
    import threading
    import time

    # waits are judged against wait_s = 2 s: a request that goes straight on takes < 0.5 s even on a loaded host
    order = InOrder(max_waiting=2, wait_s=2.0)
    t0 = time.monotonic()
    order.wait("driver", "s1", 5)  # nothing finished in this session yet: the guard decides at once
    assert time.monotonic() - t0 < 0.5
    order.finished("driver", "s1", 1, accepted=1)
    events: list[str] = []
    t = threading.Thread(target=lambda: (order.wait("driver", "s1", 3), events.append("3 goes")))
    t.start()
    time.sleep(0.05)
    order.finished("driver", "s1", 9, accepted=1)  # a refused request far ahead: 3 keeps waiting
    time.sleep(0.05)
    events.append("2 done")
    order.finished("driver", "s1", 2, accepted=2)
    t.join(5.0)
    assert events == ["2 done", "3 goes"]
    # a refused predecessor releases the request right after it (which the guard then refuses as a gap)
    t = threading.Thread(target=lambda: (order.wait("driver", "s1", 5), events.append("5 goes")))
    t.start()
    time.sleep(0.05)
    order.finished("driver", "s1", 4, accepted=2)
    t.join(5.0)
    assert events[-1] == "5 goes"
    # a request whose predecessor never comes waits wait_s at most; a third concurrent waiter does not wait
    waiters = [threading.Thread(target=order.wait, args=("driver", "s1", 10)) for _ in range(2)]
    for w in waiters:
        w.start()
    time.sleep(0.05)
    t0 = time.monotonic()
    order.wait("driver", "s1", 10)
    assert time.monotonic() - t0 < 0.5
    for w in waiters:
        w.join(5.0)
        assert not w.is_alive()
    order.wait("mallory", "s1", 3)  # another peer's session: nothing to wait for


def test_in_order_waits_beyond_wait_s_while_the_predecessor_is_in_progress_here():
    """A loaded host: request 2 is in progress here (it entered its turn: waiting for its own predecessor, for the
    party's lock, or being handled) for longer than wait_s when request 3 arrives. Request 3 must wait until 2 has
    finished (else, with 2 itself still queued, 3 can reach the party's lock first and a legitimate pipelined step
    is refused as out of order); a predecessor that never arrived is still waited for at most wait_s."""
    import threading
    import time

    order = InOrder(max_waiting=2, wait_s=0.05)
    order.finished("driver", "s1", 1, accepted=1)
    events: list[str] = []
    entered = threading.Event()

    def second() -> None:
        with order.turn("driver", "s1", 2, accepted=lambda: 2):
            entered.set()
            time.sleep(0.4)  # 8 x wait_s: the slow predecessor
            events.append("2 done")

    t2 = threading.Thread(target=second)
    t2.start()
    assert entered.wait(5.0)
    order.wait("driver", "s1", 3)
    events.append("3 goes")
    t2.join(5.0)
    assert events == ["2 done", "3 goes"]
    # the predecessor of 5 never arrives: 5 goes on after wait_s (the guard then refuses it as a gap)
    t0 = time.monotonic()
    order.wait("driver", "s1", 5)
    assert time.monotonic() - t0 < 1.0
    assert not order._in_progress  # nothing left behind once every request has finished
