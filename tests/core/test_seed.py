import random

import numpy as np
import pytest
import torch

from modelward.core.seed import make_generator, seeded


def test_seeded_is_reproducible_and_restores_outer_state() -> None:
    torch.manual_seed(123)
    np.random.seed(5)
    random.seed(5)
    expected = (torch.rand(3), np.random.rand(), random.random())
    torch.manual_seed(123)
    np.random.seed(5)
    random.seed(5)
    with seeded(7):
        a = (torch.rand(3), np.random.rand(), random.random())
    after = (torch.rand(3), np.random.rand(), random.random())
    assert torch.equal(after[0], expected[0]) and after[1:] == expected[1:]  # outer streams untouched
    with seeded(7):
        b = (torch.rand(3), np.random.rand(), random.random())
    assert torch.equal(a[0], b[0]) and a[1:] == b[1:]
    with pytest.raises(RuntimeError), seeded(1):
        raise RuntimeError
    assert torch.equal(make_generator(3).initial_seed() * torch.ones(1), torch.tensor([3.0]))
    assert torch.equal(torch.rand(2, generator=make_generator(3)), torch.rand(2, generator=make_generator(3)))
