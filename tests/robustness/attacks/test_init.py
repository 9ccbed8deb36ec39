"""The attack registry: unknown names and parameters are refused naming the valid choices."""

from __future__ import annotations

import pytest
import torch

from modelward.errors import ConfigError
from modelward.robustness.attacks import ATTACK_NAMES, make_attack

torch.set_num_threads(1)  # the CI box is shared; oversubscribed BLAS threads are 10-50x slower


def test_registry_errors_name_valid_choices(victim):
    assert set(ATTACK_NAMES) == {"fgsm", "bim", "ilcm", "pgd", "cw", "lbfgs", "jsma", "transfer"}
    with pytest.raises(ConfigError, match="valid choices: .*fgsm"):
        make_attack("deepfool", victim)
    with pytest.raises(ConfigError, match=r"valid: \['eps'"):
        make_attack("pgd", victim, epsilon=0.1)
    with pytest.raises(ConfigError, match="norm"):
        make_attack("pgd", victim, eps=0.1, norm="l1")


# -- comparable ε sweeps (issue 13 item 8) ---------------------------------------------------------------------
