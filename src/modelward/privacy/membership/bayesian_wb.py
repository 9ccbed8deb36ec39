"""bayesian-wb (seed 002 §8.2.2, Observation 8.2, Algorithm 8.1): the target's top weights minus a proxy's.

For a linear top ĝ(z) = Ŵz + b̂ trained (like the target) on members, and proxies g̃ trained with the *same*
algorithm and hyper-parameters on hold-out data S̃ ∼ D* (so μ̃ ≈ μ*), Eq. 8.10–8.11 give the Theorem 8.1 attack

    Pr[member | x, y] = σ(w^yᵀ z + b^y),  w^y = Ŵ_y − W̃_y,  b^y = b̂_y − b̃_y,  z = ĥ(x)

with W̃, b̃ the **mean over 10 proxies** trained on bootstrap samples of the hold-out (§8.3.3). For a linear
model z = x; for a deep model z is the input of its last linear layer (the final-layer attack used for the
thesis' dense targets, §8.3.2) and the proxies are copies of that layer trained on ĥ(S̃) (Alg. 8.3).
Score = the log-odds w^yᵀz + b^y (threshold 0 ⇔ probability ½).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from modelward.errors import ConfigError
from modelward.privacy.membership.base import AttackData, MembershipAttack
from modelward.privacy.membership.proxies import cached_tops
from modelward.privacy.slicing import features, get_layer


class BayesianWB(MembershipAttack):
    """Args:
        proxies: number of proxy models (thesis: 10); bootstrap: train each on a bootstrap sample of the hold-out.
        layer: the last linear layer to attack (default: the model's last ``nn.Linear``).
    Example:
        >>> a = BayesianWB(proxies=10).fit(AttackData(target, x_hold, y_hold, 2, trainer=A))
        >>> a.w, a.b          # per-class attack weights (m, d) and biases (m,)
        >>> a.decide(x, y)    # member iff σ(w^yᵀ z + b^y) > ½
    """

    name = "bayesian_wb"
    threshold = 0.0

    def __init__(self, proxies: int = 10, bootstrap: bool = True, layer: str | None = None) -> None:
        if proxies < 1:
            raise ConfigError(f"bayesian_wb.proxies must be >= 1, got {proxies}")
        self.proxies, self.bootstrap, self.layer = proxies, bootstrap, layer

    def fit(self, data: AttackData) -> BayesianWB:
        self.data = data
        self.layer, tops = cached_tops(data, self.layer, self.proxies, self.bootstrap)
        lin = get_layer(data.target, self.layer)
        if not isinstance(lin, nn.Linear):
            raise ConfigError(f"bayesian_wb attacks a linear layer; {self.layer!r} is {type(lin).__name__} "
                              "(use deep_wb for other slices)")
        W_hat, b_hat = lin.weight.detach().double(), _bias(lin)
        proxy_lin = [get_layer(t.model, self.layer) for t in tops]
        W_til = torch.stack([p.weight.detach().double() for p in proxy_lin]).mean(0)
        b_til = torch.stack([_bias(p) for p in proxy_lin]).mean(0)
        self.w = (W_hat - W_til).numpy()  # (m, d): row y is w^y
        self.b = (b_hat - b_til).numpy()
        return self

    def score(self, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
        z = features(self.data.target, self.layer, x).double().numpy()
        yy = np.asarray(y).astype(int)
        return (self.w[yy] * z).sum(1) + self.b[yy]


def _bias(lin: nn.Linear) -> torch.Tensor:
    return lin.bias.detach().double() if lin.bias is not None else torch.zeros(lin.out_features, dtype=torch.float64)
