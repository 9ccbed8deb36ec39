"""Privacy audits (seed 002 ch. 8, App. C–D): membership inference, model inversion, property inference, DP-SGD.

- :mod:`.membership` — one class per membership-inference attack (naive, loss, shadow, gnb, bayesian_wb, nn_wb,
  deep_wb, calibration, lira, rmia); each returns per-example scores (higher = member) and thresholded decisions.
- :mod:`.metrics` — accuracy, advantage, precision at the attack's threshold, ROC / AUC / TPR at low FPR.
- :mod:`.inversion` — model inversion by projected gradient descent in input space (Eq. 8.1).
- :mod:`.property` — reconstruction-based property inference (Alg. 8.4) and overt-encoding analysis (§8.6).
- :mod:`.epsilon` — empirical ε lower bounds from any attack's scores (TF Privacy's ratio methods).
- :mod:`.dp_audit` — one-run audit of a DP-SGD claim with canaries (Steinke, Nasr & Jagielski 2023).
- :mod:`.risk` — per-slice and per-record membership risk; :mod:`.served` — attacks through ``guard serve``.
- :mod:`.dp` — DP-SGD through Opacus with the accountant named next to every ε, and the advantage bound check.
- :mod:`.shadows` — shadow / proxy models, many small ones trained together (stacked ``torch.func`` modules).
- :mod:`.audit` — the resumable audit study behind ``modelward privacy audit``.
"""

from modelward.core.registry import lazy_exports

_P = "modelward.privacy"
_EXPORTS = {
    "ATTACKS": f"{_P}.membership:ATTACKS", "make_membership_attack": f"{_P}.membership:make_membership_attack",
    "AttackData": f"{_P}.membership.base:AttackData", "MembershipAttack": f"{_P}.membership.base:MembershipAttack",
    "membership_split": f"{_P}.protocol:membership_split",
    "evaluate_membership": f"{_P}.metrics:evaluate", "roc_curve": f"{_P}.metrics:roc_curve",
    "membership_figures": f"{_P}.metrics:membership_figures",
    "AuditConfig": f"{_P}.audit:AuditConfig", "run_audit": f"{_P}.audit:run_audit",
    "invert": f"{_P}.inversion:invert",
    "HyperplaneRecovery": f"{_P}.hyperplanes:HyperplaneRecovery", "match_columns": f"{_P}.hyperplanes:match_columns",
    "PropertyConfig": f"{_P}.property:PropertyConfig", "run_property": f"{_P}.property:run_property",
    "DPConfig": f"{_P}.dp:DPConfig", "train_dp": f"{_P}.dp:train_dp",
    "epsilon_lower_bound": f"{_P}.epsilon:epsilon_lower_bound",
    "DPAuditConfig": f"{_P}.dp_audit:DPAuditConfig", "run_dp_audit": f"{_P}.dp_audit:run_dp_audit",
    "ServedAuditConfig": f"{_P}.served:ServedAuditConfig", "run_served_audit": f"{_P}.served:run_served_audit",
    "slice_risk": f"{_P}.risk:slice_risk", "exposed_records": f"{_P}.risk:exposed_records",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
