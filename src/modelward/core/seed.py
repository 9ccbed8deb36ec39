"""Seeding without global side effects: library code never calls bare ``torch.manual_seed``.

:func:`seeded` forks the global RNGs (torch CPU and, when initialised, CUDA; numpy; Python ``random``), seeds
them, and restores the caller's state on exit, so a seeded block is reproducible and leaves no trace on the rest
of the program. Prefer an explicit generator (:func:`make_generator`) where an API takes one; use
:func:`seeded` where code draws from the global RNG (``nn.Module`` constructors' default initialisation,
dropout).

Example:
    >>> import torch
    >>> with seeded(0):
    ...     a = torch.rand(2)
    >>> with seeded(0):
    ...     b = torch.rand(2)
    >>> bool((a == b).all())
    True
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def seeded(seed: int, *, numpy: bool = True, python: bool = True) -> Iterator[None]:
    """Run the block with the global RNGs seeded with `seed`; the previous states come back afterwards.

    Args:
        seed: the seed (``torch.manual_seed`` semantics; also used for numpy and ``random``).
        numpy: also fork and seed numpy's global RNG.
        python: also fork and seed Python's ``random``.
    """
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    cpu_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if cuda else None
    np_state = py_state = None
    if numpy:
        import numpy as np

        np_state = np.random.get_state()
        np.random.seed(seed % 2**32)
    if python:
        py_state = random.getstate()
        random.seed(seed)
    torch.manual_seed(seed)
    try:
        yield
    finally:
        torch.set_rng_state(cpu_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
        if np_state is not None:
            import numpy as np

            np.random.set_state(np_state)
        if py_state is not None:
            random.setstate(py_state)


def make_generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A fresh ``torch.Generator`` on `device` seeded with `seed` (pass it to ``randperm``, ``rand``, ...)."""
    return torch.Generator(device=device).manual_seed(int(seed))
