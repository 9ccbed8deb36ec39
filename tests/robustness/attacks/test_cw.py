"""C&W finds smaller perturbations than FGSM at equal success."""

from __future__ import annotations

import torch

from modelward.robustness.attacks import make_attack

torch.set_num_threads(1)  # the CI box is shared; oversubscribed BLAS threads are 10-50x slower


def test_cw_smaller_than_fgsm_at_equal_success(victim, batch):
    x, y = batch[0][:30], batch[1][:30]
    cw = make_attack("cw", victim, steps=60, binary_steps=5, lr=0.05)(x, y)
    # smallest FGSM ε reaching C&W's success rate
    for eps in [0.05 * k for k in range(1, 21)]:
        fg = make_attack("fgsm", victim, eps=eps)(x, y)
        if fg.success_rate >= cw.success_rate:
            break
    assert fg.success_rate >= cw.success_rate
    l2_cw = (cw.x_adv - x).flatten(1).norm(dim=1)[cw.success].mean()
    l2_fg = (fg.x_adv - x).flatten(1).norm(dim=1)[fg.success].mean()
    assert l2_cw < 0.8 * l2_fg


