"""Opt-in compression of the tensors that cross party boundaries (issue 27): the int8 and top-k codecs' error
bounds, the default path untouched, a two-party training run with int8, and malformed compressed payloads refused
without touching the receiver's state."""

import json
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from modelward.core.train import TrainConfig
from modelward.errors import ConfigError
from modelward.governance.party.config import load_party_config
from modelward.governance.party.machine import Party
from modelward.governance.party.tensors import CompressionConfig, TensorCompression
from modelward.governance.wire import (
    MAGIC,
    Codec,
    Message,
    WireError,
    compressed_nbytes,
    decode,
    encode,
    int8_quantize,
    roundtrip,
)

TC = TrainConfig(steps=5, eval_every=5, batch_size=16, eval_batch_size=128, lr=0.05)


@pytest.mark.parametrize("per_row", [True, False])
@pytest.mark.parametrize("shape", [(32, 4, 4, 4), (7, 33), (5,)])
def test_int8_error_is_at_most_half_a_quantization_step(per_row, shape):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=gen) * torch.logspace(-3, 2, shape[0])[(...,) + (None,) * (len(shape) - 1)]
    x[0] = 0.0  # an all-zero row (scale 0) decodes to zeros
    codec = Codec("int8", scale="row" if per_row else "tensor")
    y = roundtrip(x, codec)
    rows = x.reshape(x.shape[0], -1) if x.dim() >= 2 else x.reshape(1, -1)
    amax = rows.abs().amax(1, keepdim=True) if per_row else rows.abs().amax().reshape(1, 1)
    step = (amax / 127).expand_as(rows)
    err = (y.reshape(rows.shape) - rows).abs()
    assert y.shape == x.shape and y.dtype == torch.float32
    assert bool((err <= step / 2 * (1 + 1e-5) + 1e-30).all()), float((err / step).nan_to_num().max())
    assert bool((err > 0).any())  # it is lossy (a codec returning x would pass the bound above)
    if x.dim() >= 2:
        assert float(y[0].abs().max()) == 0.0
        assert compressed_nbytes(list(x.shape), codec) < 0.3 * x.numel() * 4
        sent = encode(Message("step", tensors={"h": x}, codecs={"h": codec}))
        assert len(sent) - len(encode(Message("step", tensors={}))) < compressed_nbytes(list(x.shape), codec) + 200


def test_int8_stochastic_rounding_is_unbiased_keyed_and_within_one_step():
    x = torch.rand(64, 50) * 2 - 1
    keyed = Codec("int8", stochastic=True, key=b"k" * 32)
    a, b = roundtrip(x, keyed, step=3), roundtrip(x, keyed, step=3)
    assert torch.equal(a, b)  # the same step sends the same codes (a retried step reveals nothing new)
    assert not torch.equal(a, roundtrip(x, keyed, step=4))
    scale = x.abs().amax(1, keepdim=True) / 127
    assert bool(((a - x).abs() < scale * (1 + 1e-5)).all())
    mean = torch.stack([roundtrip(x, keyed, step=s) for s in range(200)]).mean(0)
    # E[q s] = x: the average of 200 draws is within a few standard errors (at most s/2 each)
    assert float(((mean - x).abs() / scale).max()) < 0.25
    assert float(((roundtrip(x, Codec("int8")) - x).abs() / scale).mean()) > 0.2  # nearest rounding: biased per entry


def test_int8_quantize_codes_span_the_symmetric_range():
    s, q = int8_quantize(torch.tensor([[2.0, -2.0, 1.0], [0.0, 0.0, 0.0]]))
    assert q.tolist() == [[127, -127, 64], [0, 0, 0]]
    assert s.tolist() == pytest.approx([2.0 / 127, 0.0], rel=1e-6)


@pytest.mark.parametrize("ratio", [0.1, 0.01, 1.0])
def test_topk_keeps_exactly_the_k_largest_entries_of_every_row(ratio):
    x = torch.randn(16, 8, 4, 4, generator=torch.Generator().manual_seed(2)).contiguous(
        memory_format=torch.channels_last)
    codec = Codec("topk", ratio=ratio)
    y = roundtrip(x, codec)
    k = codec.k(128)
    assert k == max(1, -(-int(ratio * 1000) * 128 // 1000))
    flat_x, flat_y = x.reshape(16, -1), y.reshape(16, -1)
    for r in range(16):
        kept = set(flat_y[r].nonzero().flatten().tolist())
        assert kept == set(flat_x[r].abs().topk(k).indices.tolist())
        assert torch.equal(flat_y[r][list(kept)], flat_x[r][list(kept)])  # kept values are exact
    msg = decode(encode(Message("step", tensors={"g": x}, codecs={"g": codec})))
    assert msg.received == {"g": f"topk(k={k} of 128) {16 * k * 6} B"}
    assert compressed_nbytes([16, 8, 4, 4], codec) == 16 * k * 6  # float32 values + int16 indices


def test_without_codecs_the_bytes_are_exactly_the_uncompressed_encoding():
    x = torch.randn(8, 4, 4, 4).contiguous(memory_format=torch.channels_last)
    plain = Message("step", "s", 2, 3, {"a": 1}, {"h": x, "idx": torch.arange(8)})
    assert encode(plain) == encode(Message("step", "s", 2, 3, {"a": 1}, {"h": x, "idx": torch.arange(8)}, {}))
    assert TensorCompression().codec() is None and roundtrip(x, None) is x
    assert decode(encode(plain)).received == {}


def test_compression_config_names_the_bad_field_and_the_choices(make_chain):
    with pytest.raises(ValueError, match="'none', 'int8' or 'topk'"):
        CompressionConfig.model_validate({"gradients": {"method": "fp4"}})
    c = make_chain()
    with pytest.raises(ConfigError, match="compression.activations.method"):
        load_party_config(c.split.party_configs["alice"], ["compression.activations.method=fp4"])
    with pytest.raises(ConfigError, match="sends no activations"):  # bob holds the labels: he sends no h
        Party(load_party_config(c.split.party_configs["bob"], ["compression.activations.method=int8"]))
    with pytest.raises(ConfigError, match="sends no gradients"):
        Party(load_party_config(c.split.party_configs["alice"], ["compression.gradients.method=topk"]))


def _int8_both_ways() -> dict:
    return {"alice": {"compression": {"activations": {"method": "int8"}}},
            "bob": {"compression": {"gradients": {"method": "int8"}}}}


def test_a_two_party_run_with_int8_both_ways_trains_like_the_exact_one(make_chain):
    tc = TrainConfig(steps=60, eval_every=60, batch_size=32, eval_batch_size=512, lr=0.05, momentum=0.9,
                     loss="error")
    exact, packed = make_chain(), make_chain(extra=_int8_both_ways())
    results = []
    for c in (exact, packed):
        with c.driver(tc, seed=1) as drv:
            results.append(drv.train())
    err_exact, err_int8 = results[0].curve[-1][1], results[1].curve[-1][1]
    assert err_int8 < 0.5 and err_exact < 0.5  # 10 classes: chance is 0.9
    assert abs(err_int8 - err_exact) < 0.1
    assert exact.digests()["bob"] != packed.digests()["bob"]  # bob trained on the decoded activations
    link_exact = exact.parties["alice"].next_client.stats
    link_int8 = packed.parties["alice"].next_client.stats
    assert link_int8.raw == link_exact.raw  # the same dense tensors ...
    assert link_int8.sent + link_int8.received < 0.5 * (link_exact.sent + link_exact.received)  # ... in < half
    # the audit records what crossed the link and how
    bob_rows = [r for (r,) in packed.parties["bob"].audit.db.execute(
        "SELECT reason FROM audit WHERE op='step' AND decision='allow'")]
    assert bob_rows and all("received h as int8/row" in r and "g sent as int8/row" in r for r in bob_rows)
    alice_rows = [r for (r,) in packed.parties["alice"].audit.db.execute(
        "SELECT reason FROM audit WHERE op='step' AND decision='allow'")]
    assert alice_rows and all("h sent as int8/row" in r and "bob returned g as int8/row" in r for r in alice_rows)
    ev = [r for (r,) in packed.parties["bob"].audit.db.execute("SELECT reason FROM audit WHERE op='eval'")]
    assert ev and all("received h as int8/row" in r for r in ev)  # evaluation activations too
    assert not any("int8" in r for (r,) in exact.parties["bob"].audit.db.execute("SELECT reason FROM audit"))


def test_an_explicit_none_table_is_bit_identical_to_no_table(make_chain):
    plain = make_chain()
    none = make_chain(extra={"alice": {"compression": {"activations": {"method": "none"}}},
                             "bob": {"compression": {"gradients": {"method": "none", "ratio": 0.5}}}})
    for c in (plain, none):
        with c.driver(TC, seed=2) as drv:
            drv.train()
    assert plain.digests() == none.digests()


def _frame(header: dict, blob: bytes) -> bytes:
    h = json.dumps(header, separators=(",", ":")).encode()
    return MAGIC + struct.pack("<I", len(h)) + h + blob


def _split(data: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack("<I", data[4:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def _hostile_payloads(session: str, h: torch.Tensor) -> dict[str, bytes]:
    """Compressed step messages from a hostile alice, each malformed in one way (seq 1, step 0)."""
    idx = torch.arange(h.shape[0])
    out = {}
    good8 = encode(Message("step", session, 0, 1, {}, {"h": h, "idx": idx}, {"h": Codec("int8")}))
    goodk = encode(Message("step", session, 0, 1, {}, {"h": h, "idx": idx}, {"h": Codec("topk", ratio=0.1)}))
    hdr, blob = _split(good8)
    spec = hdr["tensors"][0]
    rows = h.shape[0]
    n_scale = rows * 4

    def patched(b: bytes, at: int, new: bytes) -> bytes:
        return b[:at] + new + b[at + len(new):]

    out["NaN scale"] = _frame(hdr, patched(blob, 0, struct.pack("<f", float("nan"))))
    out["negative scale"] = _frame(hdr, patched(blob, 4, struct.pack("<f", -1.0)))
    out["code -128"] = _frame(hdr, patched(blob, n_scale + 5, b"\x80"))
    out["truncated"] = _frame(hdr, blob[:-9])
    out["nbytes lie"] = _frame({**hdr, "tensors": [{**spec, "nbytes": spec["nbytes"] - 1}, *hdr["tensors"][1:]]},
                               blob[:-1])
    out["unknown codec"] = _frame({**hdr, "tensors": [{**spec, "codec": "zstd"}, *hdr["tensors"][1:]]}, blob)
    out["int8 of int64"] = _frame({**hdr, "tensors": [{**spec, "dtype": "int64"}, *hdr["tensors"][1:]]}, blob)
    out["bad scale kind"] = _frame({**hdr, "tensors": [{**spec, "scale": "col"}, *hdr["tensors"][1:]]}, blob)
    hk, bk = _split(goodk)
    sk = hk["tensors"][0]
    k = sk["k"]
    vals = rows * k * 4
    first_idx = struct.unpack("<h", bk[vals : vals + 2])[0]
    out["index out of range"] = _frame(hk, patched(bk, vals, struct.pack("<h", 64)))
    out["negative index"] = _frame(hk, patched(bk, vals, struct.pack("<h", -1)))
    second = struct.pack("<h", first_idx)
    out["repeated index"] = _frame(hk, patched(bk, vals + 2, second))
    out["k beyond the row"] = _frame({**hk, "tensors": [{**sk, "k": 65, "nbytes": rows * 65 * 6},
                                                        *hk["tensors"][1:]]}, bk)
    # a decompression bomb: one kept entry per row of a (16, 2^14, 2^12, 1) activation = 4 GiB decoded
    bomb = {**sk, "shape": [rows, 2**14, 2**12, 1], "k": 1, "nbytes": rows * 1 * 8}
    bomb.pop("layout", None)
    out["decompression bomb"] = _frame({**hk, "tensors": [bomb, *hk["tensors"][1:]]},
                                       bk[: rows * 4] + b"\x00" * (rows * 4) + bk[vals + rows * k * 2:])
    return out


REASONS = {"NaN scale": "finite and non-negative", "negative scale": "finite and non-negative",
           "code -128": "code -128", "truncated": "truncated", "nbytes lie": "bytes declared",
           "unknown codec": "codec 'zstd' not allowed", "int8 of int64": "decodes to float32",
           "bad scale kind": "int8 scale 'col'", "index out of range": "indices outside",
           "negative index": "indices outside", "repeated index": "repeated within a row",
           "k beyond the row": "k=65", "decompression bomb": "beyond the limit"}


def test_malformed_compressed_payloads_are_refused_without_touching_state(make_chain):
    c = make_chain()
    drv = c.driver(TC)
    drv.open(train=True)
    bob = c.parties["bob"]
    c.client("bob", "alice").call(Message("open", drv.session))
    h = torch.randn(16, 4, 4, 4).contiguous(memory_format=torch.channels_last)  # bob's input: (4, 4, 4)
    before = c.digests()["bob"]
    payloads = _hostile_payloads(drv.session, h)
    assert set(payloads) == set(REASONS)
    for what, data in payloads.items():
        with pytest.raises(WireError, match=REASONS[what]):
            bob.handle("alice", data)
        assert c.digests()["bob"] == before and bob.step == 0 and bob.prepared is None, what
    rows = bob.audit.db.execute("SELECT op, decision FROM audit WHERE caller='alice' AND op='(malformed)'")
    assert len(rows.fetchall()) >= 1  # refusals are audited (rate-limited per peer)
    # nothing advanced: a well-formed compressed step with the same sequence number is served
    ok = encode(Message("step", drv.session, 0, 1, {}, {"h": h, "idx": torch.arange(16)}, {"h": Codec("int8")}))
    reply = decode(bob.handle("alice", ok))
    assert reply.tensors["g"].shape == h.shape and bob.prepared is not None


def test_the_leakage_audit_scores_the_gradient_alice_decodes():
    from modelward.core.data import DataConfig, load_data
    from modelward.core.zoo import ModelConfig
    from modelward.governance.leakage.study import LeakageAuditConfig, simulate_split
    from modelward.governance.party.label_protection import LabelProtectionConfig

    data = load_data(DataConfig(source="breast_cancer"))
    mc, tc = ModelConfig(arch="mlp", hidden=[32]), TrainConfig(steps=15, batch_size=32, lr=0.01)
    top1 = CompressionConfig.model_validate({"gradients": {"method": "topk", "ratio": 1 / 32}})
    plain = simulate_split(data, mc, "fc1", tc, LabelProtectionConfig(), seed=0, positive=0)
    sparse = simulate_split(data, mc, "fc1", tc, LabelProtectionConfig(), seed=0, positive=0, compression=top1)
    assert plain["direction_auc"] > 0.95
    # one entry of 32 per row: what Alice sees (and learns from) differs, and the attacks score that
    assert sparse != plain and 0.0 <= sparse["direction_auc"] <= 1.0
    assert LeakageAuditConfig.model_validate({"compression": {"gradients": {"method": "topk", "ratio": 0.1}}}
                                             ).compression.gradients.ratio == 0.1


def test_a_middle_party_decodes_what_it_receives_and_compresses_what_it_sends(make_chain):
    c = make_chain(("alice", "carol", "bob"), ("conv1", "conv2"), extra={
        "alice": {"compression": {"activations": {"method": "int8"}}},
        "carol": {"compression": {"activations": {"method": "int8", "scale": "tensor"},
                                  "gradients": {"method": "topk", "ratio": 0.25}}},
        "bob": {"compression": {"gradients": {"method": "int8", "stochastic": True, "seed": 3}}}})
    with c.driver(TC, seed=1) as drv:
        res = drv.train()
    assert res.steps_run == TC.steps and all(p.step == TC.steps for p in c.parties.values())

    def reasons(n):
        return [r for (r,) in c.parties[n].audit.db.execute(
            "SELECT reason FROM audit WHERE op='step' AND decision='allow'")]

    assert all("received h as int8/row" in r and "g sent as topk(k=" in r and "h sent as int8/tensor" in r
               and "bob returned g as int8/row" in r for r in reasons("carol"))
    assert all("received h as int8/tensor" in r and "g sent as int8/row/stochastic" in r for r in reasons("bob"))
    assert all("carol returned g as topk(k=" in r for r in reasons("alice"))


def test_only_float32_tensors_are_sent_compressed():
    with pytest.raises(WireError, match="only float32"):
        encode(Message("step", tensors={"idx": torch.arange(4)}, codecs={"idx": Codec("int8")}))
    with pytest.raises(WireError, match="valid choices"):
        Codec("fp8")
    with pytest.raises(WireError, match="ratio"):
        Codec("topk", ratio=0.0)


_GOOD = [encode(Message("step", "s", 1, 1, {}, {"h": torch.randn(4, 2, 3, 3).contiguous(
    memory_format=torch.channels_last), "idx": torch.arange(4)}, {"h": c}))
    for c in (Codec("int8"), Codec("int8", scale="tensor"), Codec("topk", ratio=0.2))]


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2), st.binary(min_size=1, max_size=32), st.integers(0, 400))
def test_fuzz_corrupted_compressed_messages_never_crash_nor_inflate(which, noise, pos):
    good = _GOOD[which]
    pos = min(pos, len(good) - 1)
    bad = good[:pos] + noise + good[pos + len(noise):]
    try:
        m = decode(bad, max_bytes=4096)
    except WireError:
        return
    assert sum(t.numel() * t.element_size() for t in m.tensors.values()) <= 4096 + len(bad)
    for t in m.tensors.values():
        assert t.dtype != torch.float32 or bool(torch.isfinite(t).all())
