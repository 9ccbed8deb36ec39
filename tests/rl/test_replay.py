"""Replay buffer: sum tree, prioritized sampling, n-step folding, safetensors persistence."""

import numpy as np
import pytest

from modelward.errors import DataError
from modelward.rl.replay import NStepFolder, ReplayBuffer, SumTree


def test_sum_tree_matches_cumsum():
    rng = np.random.default_rng(0)
    p = rng.random(300)
    t = SumTree(300)
    t.set(np.arange(300), p)
    t.set(np.array([7]), np.array([3.0]))
    p[7] = 3.0
    assert t.total == pytest.approx(p.sum())
    u = rng.random(64) * p.sum()
    assert (t.find(u) == np.searchsorted(np.cumsum(p), u, side="right")).all()


def test_prioritized_sampling_follows_priorities():
    buf = ReplayBuffer(4, (1,), np.float32, prioritized=True, alpha=1.0)
    for i in range(4):
        buf.add(np.array([i], np.float32), i, 0.0, np.array([i], np.float32), 1.0)
    buf.update_priorities(np.arange(4), np.array([1.0, 1.0, 1.0, 7.0]))
    rng = np.random.default_rng(0)
    counts = np.zeros(4)
    for _ in range(200):
        b, idx = buf.sample(10, rng, beta=1.0)
        counts += np.bincount(idx, minlength=4)
        assert b["weight"].max() == pytest.approx(1.0)
    assert counts[3] / counts.sum() == pytest.approx(0.7, abs=0.05)


def test_n_step_folding():
    f = NStepFolder(3, 0.5)
    o = [np.array([k]) for k in range(6)]
    assert f.push(o[0], 0, 1.0, o[1], False, False) == []
    assert f.push(o[1], 1, 2.0, o[2], False, False) == []
    (s, a, r, s2, d), = f.push(o[2], 2, 4.0, o[3], False, False)
    assert (s, a, s2, d) == (o[0], 0, o[3], 0.125) and r == pytest.approx(1 + 1 + 1)
    out = f.push(o[3], 3, 8.0, o[4], True, True)  # terminal: flush everything, no bootstrap
    assert [x[1] for x in out] == [1, 2, 3] and all(x[4] == 0.0 for x in out)
    assert out[0][2] == pytest.approx(2 + 2 + 2) and out[2][2] == pytest.approx(8.0)


def test_save_load_roundtrip(tmp_path):
    rng = np.random.default_rng(1)
    buf = ReplayBuffer(8, (2, 3, 3), np.uint8, prioritized=True)
    for i in range(11):
        buf.add(rng.integers(0, 2, (2, 3, 3)).astype(np.uint8), i % 3, float(i), np.zeros((2, 3, 3), np.uint8), .9)
    buf.update_priorities(np.array([0, 5]), np.array([3.0, 0.1]))
    buf.save(tmp_path / "b.safetensors")
    back = ReplayBuffer.load(tmp_path / "b.safetensors")
    assert (len(back), back.pos) == (8, 3) and back.obs.dtype == np.uint8
    assert np.array_equal(back.obs, buf.obs) and np.array_equal(back.reward, buf.reward)
    assert back.tree.total == pytest.approx(buf.tree.total)
    with pytest.raises(DataError):
        ReplayBuffer.load(tmp_path / "missing.safetensors")
