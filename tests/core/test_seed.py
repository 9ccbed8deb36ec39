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


def test_library_code_seeds_only_through_core_seed() -> None:
    """A bare ``torch.manual_seed`` (or ``np.random.seed`` / ``random.seed``) in library code reseeds the caller's
    global RNG as a side effect: everything drawn after it, in the caller's code too, changes with the library's
    seed. Library code uses :func:`seeded` or a generator; this names any new call by file and line."""
    import re
    from pathlib import Path

    import modelward

    src = Path(modelward.__file__).parent
    bare = re.compile(r"(?<![\w.])(torch\.manual_seed|torch\.cuda\.manual_seed(_all)?|np\.random\.seed|"
                      r"numpy\.random\.seed|random\.seed)\(")
    found = []
    for path in sorted(src.rglob("*.py")):
        if path == src / "core" / "seed.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if bare.search(code) and ">>>" not in line:
                found.append(f"{path.relative_to(src)}:{n}: {line.strip()}")
    assert not found, "seed through modelward.core.seed (seeded / make_generator):\n" + "\n".join(found)
