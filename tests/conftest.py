"""Suite-wide settings: hypothesis is derandomized (the same examples every run) so CI is reproducible; set
HYPOTHESIS_PROFILE=dev for fresh random examples while developing. Every test starts from the same global random
state (torch, NumPy, random): since torch 2.13 an unseeded process draws a fresh seed, so a test that forgets to
seed would otherwise see different numbers in every run."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _same_global_random_state() -> None:
    import random

    import numpy as np
    import torch

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` run the main paths on CUDA; without a CUDA device they are skipped, saying so."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
