"""STRIP: the entropy test on a backdoored model, its threshold from clean inputs only, and the guard monitor's
section (bad files are refused, nothing is unpickled)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from modelward.backdoor.attacks.badnets import BadNets
from modelward.backdoor.detect.input.strip import STRIP, StripMonitor, StripSection
from modelward.backdoor.experiment import Trained, defender_split
from modelward.errors import ConfigError

from .conftest import TARGET


def test_strip_flags_triggered_inputs_at_the_chosen_false_rejection_rate(backdoored: Trained) -> None:
    (xd, _), (xe, ye) = defender_split(backdoored.data, 0)
    strip = STRIP(n=20, frr=0.05, seed=0).fit(backdoored.model, xd)
    flags_clean, h_clean = strip.detect(backdoored.model, xe)
    keep = ye != TARGET
    trig = BadNets(target=TARGET, size=2).apply(xe[keep])
    flags_bd, h_bd = strip.detect(backdoored.model, trig)
    assert flags_bd.float().mean() > 0.9
    assert flags_clean.float().mean() < 0.15  # ≈ frr: the threshold is the clean entropies' 5 % quantile
    assert h_bd.mean() < h_clean.mean()
    assert strip.threshold is not None and strip.clean_entropy is not None
    assert strip.threshold == pytest.approx(float(np.quantile(strip.clean_entropy, 0.05)), abs=0.5)


def test_strip_blends_and_guards_its_use() -> None:
    s = STRIP(blend="average")
    assert torch.equal(s.superimpose(torch.ones(1, 1, 2, 2), torch.zeros(1, 1, 2, 2)), torch.full((1, 1, 2, 2), 0.5))
    assert STRIP().superimpose(torch.ones(1, 1, 2, 2), torch.ones(1, 1, 2, 2)).max() == 1.0  # saturating sum
    with pytest.raises(ConfigError, match="fit"):
        STRIP().detect(torch.nn.Linear(4, 2), torch.zeros(1, 4))
    with pytest.raises(ConfigError, match="frr"):
        STRIP(frr=0.7)
    unseeded = [STRIP(seed=None)._gen.initial_seed() for _ in range(2)]
    assert unseeded[0] != unseeded[1]  # a client cannot predict which clean images its input is blended with


def test_monitor_section_reads_only_a_plain_npz_of_the_right_shape(tmp_path: Path, backdoored: Trained) -> None:
    model = backdoored.model
    assert StripMonitor.from_section(StripSection(), model, tmp_path, (1, 8, 8)) is None  # disabled: nothing runs
    with pytest.raises(ConfigError, match="clean_data"):
        StripMonitor.from_section(StripSection(enabled=True), model, tmp_path, (1, 8, 8))
    np.savez(tmp_path / "wrong.npz", x=np.zeros((5, 3, 8, 8), np.float32))
    with pytest.raises(ConfigError, match="shape"):
        StripMonitor.from_section(StripSection(enabled=True, clean_data="wrong.npz"), model, tmp_path, (1, 8, 8))
    np.savez(tmp_path / "nox.npz", images=np.zeros((5, 1, 8, 8), np.float32))
    with pytest.raises(ConfigError, match="no array 'x'"):
        StripMonitor.from_section(StripSection(enabled=True, clean_data="nox.npz"), model, tmp_path, (1, 8, 8))
    np.savez(tmp_path / "obj.npz", x=np.array([{"a": 1}], dtype=object))  # needs pickle to read: refused
    with pytest.raises(ConfigError, match="cannot read"):
        StripMonitor.from_section(StripSection(enabled=True, clean_data="obj.npz"), model, tmp_path, (1, 8, 8))
    (xd, _), (xe, ye) = defender_split(backdoored.data, 0)
    np.savez(tmp_path / "clean.npz", x=xd.numpy())
    mon = StripMonitor.from_section(StripSection(enabled=True, clean_data="clean.npz", seed=0), model, tmp_path,
                                    (1, 8, 8))
    assert mon is not None
    trig = BadNets(target=TARGET, size=2).apply(xe[ye != TARGET][:10])
    assert mon.check("alice", model, trig).sum() >= 9
    mon.check("bob", model, xe[:10])
    st = mon.status()
    assert st["keys"]["alice"]["requests_flagged"] == 1 and st["keys"]["alice"]["rows_checked"] == 10
    assert st["keys"]["bob"]["rows_flagged"] <= 2
