"""Privacy audits (seed 002 ch. 8, App. C–D): membership inference, model inversion, property inference, DP-SGD.

- :mod:`.membership` — one class per membership-inference attack (naive, loss, shadow, gnb, bayesian_wb, nn_wb,
  deep_wb, calibration, lira, rmia); each returns per-example scores (higher = member) and thresholded decisions.
- :mod:`.metrics` — accuracy, advantage, precision at the attack's threshold, ROC / AUC / TPR at low FPR.
- :mod:`.inversion` — model inversion by projected gradient descent in input space (Eq. 8.1).
- :mod:`.property` — reconstruction-based property inference (Alg. 8.4) and overt-encoding analysis (§8.6).
- :mod:`.dp` — DP-SGD through Opacus with the accountant named next to every ε, and the advantage bound check.
- :mod:`.shadows` — shadow / proxy models, many small ones trained together (stacked ``torch.func`` modules).
- :mod:`.audit` — the resumable audit study behind ``modelward privacy audit``.
"""
