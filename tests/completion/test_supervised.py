"""Mid-run checkpoints of completion runs: an original run that crashed resumes to the uninterrupted curve."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelward.completion.supervised import SupervisedProblem
from modelward.core.data import DataConfig
from modelward.core.train import TrainConfig
from modelward.core.zoo import ModelConfig


class Crash(Exception):
    pass


def _problem(every: int | None) -> SupervisedProblem:
    return SupervisedProblem(DataConfig(), ModelConfig(arch="mlp", hidden=[32]),
                             TrainConfig(steps=50, eval_every=10, batch_size=32), checkpoint_every=every)


def test_crashed_original_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    ref = _problem(None).train_original(3, "", tmp_path / "ref")

    def crash(step: int, _loss: float) -> None:
        if step == 30:
            raise Crash

    work = tmp_path / "run"
    work.mkdir()
    with pytest.raises(Crash):
        _problem(7).train_original(3, "", work, on_eval=crash)
    progress = work / "original_seed3.progress.safetensors"
    assert progress.is_file()  # the state at step 28 survived the crash
    resumed = _problem(7).train_original(3, "", work)
    assert resumed.curve == ref.curve
    assert not progress.exists()  # removed once the run finished
