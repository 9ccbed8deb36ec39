"""Shadow-model black-box attack (Shokri et al. 2017), the thesis' ``shadow-bb`` baseline (§8.3.3, digest §2.6).

Shadow models imitate the target (same algorithm A) on halves of the attacker's hold-out data; their prediction
vectors on their own training points (label "in") and on the other half ("out") train one attack model per class
(Shokri et al. §V). The thesis uses 10 shadow models. Features: the sorted-free log-softmax vector of the class'
own model (Shokri feed the full prediction vector); attack model: a small MLP (scikit-learn). Score = the attack
model's log-odds of "in" (threshold 0 ⇔ ½). Only shadow-pool points that belong to the hold-out are used.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from modelward.privacy.membership.base import AttackData, MembershipAttack, log_sigmoid_odds
from modelward.privacy.shadows import logits_of


class ShadowAttack(MembershipAttack):
    """Args: hidden: units of the per-class attack MLP; max_iter: its training iterations.

    Example:
        >>> data.shadows = ShadowPool.train(A, x_hold, y_hold, count=10)
        >>> ShadowAttack().fit(data).decide(x, y)
    """

    name = "shadow"
    threshold = 0.0

    def __init__(self, hidden: int = 64, max_iter: int = 300) -> None:
        self.hidden, self.max_iter = hidden, max_iter

    def fit(self, data: AttackData) -> ShadowAttack:
        from sklearn.neural_network import MLPClassifier

        self.data = data
        pool = data.need_shadows("shadow")
        rows = pool.lookup(data.x_aux)
        rows = rows[rows >= 0]
        feats, lab, cls = [], [], []
        for model, mask in zip(pool.models, pool.masks, strict=True):
            lp = F.log_softmax(logits_of(model, pool.x_pool[rows]), 1).numpy()
            feats.append(lp)
            lab.append(mask[rows])
            cls.append(pool.y_pool[rows].numpy())
        X, L, C = np.concatenate(feats), np.concatenate(lab), np.concatenate(cls)
        self.models: dict[int, object] = {}
        self.const: dict[int, float] = {}
        for c in range(data.num_classes):
            sel = C == c
            if sel.sum() == 0 or len(set(L[sel])) < 2:
                self.const[c] = float(L[sel].mean()) if sel.any() else 0.5
                continue
            m = MLPClassifier((self.hidden,), max_iter=self.max_iter, random_state=data.seed)
            m.fit(X[sel], L[sel])
            self.models[c] = m
        return self

    def score(self, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
        lp = F.log_softmax(logits_of(self.data.target, x), 1).numpy()
        yy = np.asarray(y).astype(int)
        p = np.empty(len(yy))
        for c in np.unique(yy):
            sel = yy == c
            m = self.models.get(int(c))
            p[sel] = m.predict_proba(lp[sel])[:, 1] if m is not None else self.const.get(int(c), 0.5)  # type: ignore[attr-defined]
        return log_sigmoid_odds(p)
