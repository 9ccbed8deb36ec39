"""Findings: every measured number of an assessment as something a security team can file and act on.

A section records :class:`Metric` s (a number, how it was counted, whether larger means more risk); this module turns
each into a :class:`Finding` with

- a confidence interval: Clopper–Pearson (exact binomial, ``scipy.stats.binomtest(...).proportion_ci("exact")``)
  for accuracies, TPRs and rates counted as k of n, a Student-t interval over seeds where there are seeds;
- a severity from the section's verdict rule (``red`` → high, ``amber`` → medium, ``green`` → low) and the rule
  in words;
- the frameworks it is filed under: OWASP Machine Learning Security Top 10 (2023) ids, MITRE ATLAS technique ids and
  NIST AI RMF 1.0 subcategories (:data:`MAPPINGS`);
- the command that reproduces it and recommended actions naming the modelward defense, with its measured cost on
  this model where the profile measured one (extraction measures ModelGuard-S/-W).

New attacks (an AutoAttack sandwich for robustness, a DP audit, ...) join by recording metrics with a
``mapping`` key of :data:`MAPPINGS`; nothing else changes.

Example:
    >>> m = Metric("pgd_linf", "PGD L∞ robust accuracy", 0.5, k=50, n=100, risk_up=False)
    >>> lo, hi = m.interval()
    >>> round(lo, 3), round(hi, 3)
    (0.398, 0.602)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from modelward.scan.scanner import conversion_command

Severity = Literal["critical", "high", "medium", "low", "info"]
SEVERITY_ORDER: tuple[Severity, ...] = ("critical", "high", "medium", "low", "info")
_VERDICT_SEVERITY: dict[str, Severity] = {"red": "high", "amber": "medium", "green": "low", "info": "info",
                                          "none": "info"}

# OWASP ML Top 10 (2023), MITRE ATLAS technique ids, NIST AI RMF 1.0 subcategories, per kind of finding
MAPPINGS: dict[str, dict[str, list[str]]] = {
    "evasion": {"owasp": ["ML01:2023 Input Manipulation Attack"],
                "atlas": ["AML.T0015 Evade ML Model", "AML.T0043 Craft Adversarial Data"],
                "nist": ["MEASURE 2.7 (security and resilience evaluated)"]},
    "membership": {"owasp": ["ML04:2023 Membership Inference Attack"],
                   "atlas": ["AML.T0024.000 Exfiltration via ML Inference API: Infer Training Data Membership"],
                   "nist": ["MEASURE 2.10 (privacy risk examined)"]},
    "inversion": {"owasp": ["ML03:2023 Model Inversion Attack"],
                  "atlas": ["AML.T0024.001 Exfiltration via ML Inference API: Invert ML Model"],
                  "nist": ["MEASURE 2.10 (privacy risk examined)"]},
    "extraction": {"owasp": ["ML05:2023 Model Theft"],
                   "atlas": ["AML.T0024.002 Exfiltration via ML Inference API: Extract ML Model",
                             "AML.T0040 ML Model Inference API Access"],
                   "nist": ["MEASURE 2.7 (security and resilience evaluated)"]},
    "completion": {"owasp": ["ML05:2023 Model Theft"],
                   "atlas": ["AML.T0044 Full ML Model Access", "AML.T0024.002 Exfiltration via ML Inference API: "
                             "Extract ML Model"],
                   "nist": ["MEASURE 2.7 (security and resilience evaluated)"]},
    "bias": {"owasp": ["ML08:2023 Model Skewing"], "atlas": ["AML.T0048 External Harms"],
             "nist": ["MEASURE 2.11 (fairness and bias evaluated)"]},
    "supply_chain": {"owasp": ["ML06:2023 AI Supply Chain Attacks"],
                     "atlas": ["AML.T0010.003 ML Supply Chain Compromise: Model",
                               "AML.T0011.000 User Execution: Unsafe ML Artifacts"],
                     "nist": ["GOVERN 6.1 (third-party risks)", "MEASURE 2.7 (security and resilience evaluated)"]},
    # issue 41 (backdoor): a backdoor found in the model, suspicious rows found in its training data
    "model_poisoning": {"owasp": ["ML10:2023 Model Poisoning"],
                        "atlas": ["AML.T0018 Manipulate AI Model (Backdoor ML Model)",
                                  "AML.T0018.000 Manipulate AI Model: Poison AI Model"],
                        "nist": ["MEASURE 2.7 (security and resilience evaluated)"]},
    "data_poisoning": {"owasp": ["ML02:2023 Data Poisoning Attack"],
                       "atlas": ["AML.T0020 Poison Training Data"],
                       "nist": ["MEASURE 2.7 (security and resilience evaluated)"]},
}
SECTION_MAPPING = {"robustness": "evasion", "privacy": "membership", "extraction": "extraction",
                   "completion": "completion", "explanations": "bias", "supply_chain": "supply_chain",
                   "backdoor": "model_poisoning"}


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact binomial interval for k successes in n trials (Clopper & Pearson 1934): the α/2 and 1 − α/2 quantiles
    of Beta(k, n − k + 1) and Beta(k + 1, n − k), via scipy's inverse regularised incomplete beta function (what
    ``scipy.stats.binomtest(k, n).proportion_ci(method="exact")`` computes, without importing scipy.stats).

    Example:
        >>> clopper_pearson(0, 10)[0]
        0.0
    """
    from scipy.special import betaincinv

    if n <= 0:
        return (float("nan"), float("nan"))
    k, n = int(k), int(n)
    a = 1.0 - confidence
    lo = 0.0 if k == 0 else float(betaincinv(k, n - k + 1, a / 2))
    hi = 1.0 if k == n else float(betaincinv(k + 1, n - k, 1 - a / 2))
    return (lo, hi)


def t_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """Student-t interval of the mean over seeds (NaN for fewer than 2 values)."""
    from scipy.special import stdtrit

    v = [float(x) for x in values if x == x]
    if len(v) < 2:
        return (float("nan"), float("nan"))
    mean = sum(v) / len(v)
    sd = math.sqrt(sum((x - mean) ** 2 for x in v) / (len(v) - 1))
    half = float(stdtrit(len(v) - 1, 0.5 + confidence / 2)) * sd / math.sqrt(len(v))
    return (mean - half, mean + half)


@dataclass
class Metric:
    """One measured number of a section.

    Attributes:
        key: stable id within the section (``pgd_linf@0.0314``); the diff matches metrics by it.
        label: what it is, in words.
        value: the estimate; k, n: successes of trials it was counted from (Clopper–Pearson), or
        seeds: one value per seed (t interval).
        risk_up: True when a larger value means more risk (TPR, substitute accuracy), False otherwise.
        unit: ``fraction`` (shown and diffed in points), ``auc`` (shown with three decimals, diffed in points) or
            ``ratio``/``score`` (raw).
        headline: the section's verdict number (the diff's default gate for the section).
        context: anything findings need (``mapping``, ``thresholds`` (green, amber), ``rule``, ``actions``;
            ``ci`` with ``ci_method``: an interval the section computed itself, carrying every source of noise (the
            diff then uses it, see :mod:`modelward.assess.diff`); ``chance``: the value of an attack that learned
            nothing, see :func:`severity_from`).
    """

    key: str
    label: str
    value: float
    k: int | None = None
    n: int | None = None
    risk_up: bool = True
    unit: str = "fraction"
    headline: bool = False
    seeds: list[float] | None = None
    context: dict[str, Any] = field(default_factory=dict)

    def interval(self, confidence: float = 0.95) -> tuple[float, float] | None:
        """The confidence interval (None where the number was not estimated from samples)."""
        if self.k is not None and self.n:
            return clopper_pearson(self.k, self.n, confidence)
        if self.seeds and len(self.seeds) > 1:
            return t_interval(self.seeds, confidence)
        return None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        ci = self.context.get("ci") or self.interval()  # a section may give the interval of a derived number
        d["ci"] = [float(c) for c in ci] if ci is not None else None
        return d


@dataclass
class Finding:
    """A finding: what was measured, how bad, under which framework ids, how to reproduce it, what to do.

    Attributes:
        id: ``section/metric-key`` (stable across runs: what the diff and SARIF rules use).
        title, severity, section, metric, value, ci (lower, upper) or None, n, unit, risk_up,
        rule: the verdict rule; owasp, atlas, nist: framework ids; reproduce: a shell command;
        actions: recommended actions (the modelward defense and its measured cost where measured).
    """

    id: str
    title: str
    severity: Severity
    section: str
    metric: str
    value: float | None
    ci: list[float] | None
    n: int | None
    unit: str
    risk_up: bool
    rule: str
    owasp: list[str]
    atlas: list[str]
    nist: list[str]
    reproduce: str
    actions: list[str]
    headline: bool = False
    locations: list[str] = field(default_factory=list)  # files a finding is about (the model file)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def severity_from(value: float, thresholds: tuple[float, float] | list[float] | None, risk_up: bool,
                  ci: tuple[float, float] | list[float] | None = None, chance: float | None = None) -> Severity:
    """low/medium/high from a value and the section's (green, amber) thresholds (inclusive on the good side).

    With the value's 95 % interval `ci` the interval is rated, not the point: low only when the whole interval is on
    the good side of the green threshold, high only when the whole interval is beyond the amber threshold, medium
    when it straddles either (:func:`straddles` says so for the card's text). Without an interval (a number that was
    not estimated from samples) the point estimate is rated.

    With a `chance` value (what an attack that learned nothing scores: TPR = FPR, AUC ½, advantage 0) and the
    value's interval `ci`, a value whose interval reaches the chance level is rated low whatever its point estimate:
    a measurement that cannot be told from chance at this sample size is no evidence of risk (issue 38: a
    chance-level attack's TPR of 2.8 % at 1 % FPR on 250 non-members is noise, not a finding).
    """
    if thresholds is None or value != value:
        return "info"
    if chance is not None and ci is not None and (ci[0] <= chance if risk_up else ci[1] >= chance):
        return "low"
    green, amber = thresholds
    if ci is not None:
        # issue 38: the interval decides, not the point estimate: low only when the whole interval is on the good
        # side of the green threshold, high only when the whole interval is beyond the amber one, medium otherwise
        # (the interval straddles a threshold: this sample cannot tell the bands apart)
        lo, hi = float(ci[0]), float(ci[1])
        if risk_up:
            return "low" if hi <= green else "high" if lo > amber else "medium"
        return "low" if lo >= green else "high" if hi < amber else "medium"
    if risk_up:
        return "low" if value <= green else "medium" if value <= amber else "high"
    return "low" if value >= green else "medium" if value >= amber else "high"


def straddles(m: dict[str, Any]) -> bool:
    """Whether a recorded metric's interval contains one of its thresholds (its rating is then medium because the
    sample cannot decide, not because the point estimate is in the amber band)."""
    ci, th = m.get("ci"), m.get("context", {}).get("thresholds")
    return bool(ci and th) and any(float(ci[0]) < t < float(ci[1]) for t in th)


def rate_metric(m: dict[str, Any]) -> Severity:
    """The severity of one recorded metric (a :meth:`Metric.to_dict`): its context's fixed ``severity``, else
    :func:`severity_from` with its thresholds, interval and chance level."""
    ctx = m.get("context", {})
    return ctx.get("severity") or severity_from(m["value"], ctx.get("thresholds"), m["risk_up"], m.get("ci"),
                                                ctx.get("chance"))


def fmt_value(value: float | None, unit: str) -> str:
    """A value for people: fractions in percent (small ones with the digits they need: δ = 1e-5 is 0.001 %, not
    0.0 %), AUCs with three decimals, other numbers with three significant digits."""
    if value is None or value != value:
        return "–"
    if unit == "fraction":
        v = 100 * value
        return f"{v:.1f} %" if v == 0 or abs(v) >= 0.1 else f"{v:.2g} %"
    if unit == "auc":
        return f"{value:.3f}"
    return f"{value:.3g}"


def section_findings(section: dict[str, Any], reproduce: str) -> list[dict[str, Any]]:
    """The findings of one assessed section (its recorded metrics, mapped and rated).

    Args:
        section: a section result as recorded (``section.json``), with ``metrics``.
        reproduce: the command that re-runs this section.

    Returns:
        Finding dicts, headline first.
    """
    out = []
    for m in sorted(section.get("metrics", []), key=lambda m: not m.get("headline")):
        ctx = m.get("context", {})
        mapping = MAPPINGS[ctx.get("mapping", SECTION_MAPPING[section["section"]])]
        sev = rate_metric(m)
        if section.get("warnings") and sev != "info":
            sev = "info"  # the model did not match its own record: no verdict (the warning says why)
        ci = m.get("ci")
        out.append(Finding(
            id=f"{section['section']}/{m['key']}", title=m["label"], severity=sev, section=section["section"],
            metric=m["key"], value=m["value"], ci=ci, n=m.get("n"), unit=m.get("unit", "fraction"),
            risk_up=m["risk_up"], rule=ctx.get("rule", section.get("rule", "")), owasp=list(mapping["owasp"]),
            atlas=list(mapping["atlas"]), nist=list(mapping["nist"]), reproduce=reproduce,
            actions=list(ctx.get("actions") or DEFAULT_ACTIONS.get(section["section"], [])),
            headline=bool(m.get("headline")),
        ).to_dict())
    return out


DEFAULT_ACTIONS: dict[str, list[str]] = {
    "robustness": ["Adversarially train the model (`modelward robust train`, examples/robust_pgd.toml) or train a "
                   "certifiably robust GloRo net (examples/robust_gloro.toml); re-assess to measure the cost in "
                   "clean accuracy (not measured by this profile).",
                   "Treat inputs from untrusted sources as adversarial: validate their range and rate-limit "
                   "queries (`modelward guard serve`)."],
    "privacy": ["Train with differential privacy (DP-SGD through Opacus: examples/privacy_bcw_dp.toml) and "
                "re-assess; the accuracy cost is not measured by this profile.",
                "Serve labels or rounded top-k scores instead of full probabilities; regularise (early stopping, "
                "weight decay) to close the train/test gap."],
    "extraction": ["Serve the model behind ModelGuard-S or -W (`modelward guard serve "
                   "examples/guard_modelguard_s.toml`), with per-key query budgets."],
    "completion": ["Give each party a larger or deeper share of the model (the parts with the highest MC-hardness "
                   "in the table), or keep the first layers with the data owner."],
    "explanations": ["Re-balance or re-weight the over-predicted class in training and check the most influential "
                     "units listed in the section (`modelward bias`, `modelward explain`)."],
    "backdoor": ["Retrain from data of trusted origin after removing the rows `modelward backdoor scan` suspects, or "
                 "repair the model by unlearning the reversed trigger (`modelward backdoor mitigate`).",
                 "Serve the model with the STRIP monitor ([strip] in the guard config) to flag or refuse inputs that "
                 "carry a trigger."],
}


def scan_findings(scan: Any, reproduce: str | None = None) -> list[dict[str, Any]]:
    """Findings of a model-file scan (:class:`modelward.scan.FileScan`): one per file, critical where a pickle
    imports code-executing globals; a clean file gives one ``info`` finding (so the SARIF/report show it was checked).
    """
    mapping = MAPPINGS["supply_chain"]
    d = scan.to_dict() if hasattr(scan, "to_dict") else scan
    path = d["path"]
    cmd = reproduce or f"modelward scan {path}"
    if d["clean"]:
        sev: Severity = "info"
        title = f"model file {path} ({d['format']}): no unsafe content found"
        actions = ([f"Prefer safetensors: {conversion_command(path)}"] if d["format"] != "safetensors" else [])
    elif not d.get("scanned", True):
        sev = "medium"
        title = f"model file {path}: {d['issues'][0]['detail']}"
        actions = ["Nothing in this file was checked: convert the model to safetensors, or examine it with a scanner "
                   "for its format before anything loads it."]
    else:
        sev = d["severity"] if d["severity"] in ("critical", "high", "medium") else "low"
        issues = d["issues"]
        title = (f"model file {path} ({d['format']}): {len(issues)} issue(s), e.g. "
                 f"{issues[0]['detail']} [{issues[0]['where']}]")
        actions = ["Do not load this file with torch.load/pickle; obtain the weights from a trusted source as "
                   "safetensors, and check the file's sha256 against its publisher's."]
    return [Finding(
        id=f"supply_chain/{d['sha256'][:16]}", title=title, severity=sev, section="supply_chain",
        metric="unsafe_issues", value=float(len(d["issues"])), ci=None, n=None, unit="count", risk_up=True,
        rule="critical: a pickle imports code-executing globals (or a graph calls Python); high: other globals outside "
             "the plain-checkpoint allowlist, a Keras Lambda layer, file access; medium: a malformed file, a custom op, "
             "a file not scanned (unknown format); info: clean",
        owasp=list(mapping["owasp"]), atlas=list(mapping["atlas"]), nist=list(mapping["nist"]), reproduce=cmd,
        actions=actions, locations=[path],
    ).to_dict()]


def worst_severity(findings: list[dict[str, Any]]) -> Severity | None:
    return min((f["severity"] for f in findings), key=SEVERITY_ORDER.index, default=None)


def verdict_severity(verdict: str) -> Severity:
    return _VERDICT_SEVERITY.get(verdict, "info")


def reproduce_command(root: Any, section: str) -> str:
    """The command that re-runs one section of the assessment in `root` (from its resolved ``assess.toml``)."""
    return (f"modelward assess {root}/assess.toml --out {root}-repro-{section} "
            f"--set 'sections=[\"{section}\"]'")


def attach_findings(section: dict[str, Any], root: Any) -> dict[str, Any]:
    """Give a recorded section its findings; with the model-quality warning of ``target.json`` (accuracy near
    chance or far below the model's record) the verdict becomes *for information* and the warning is shown.

    Args:
        section: a section result dict (``SectionResult.to_dict()``).
        root: the assessment folder.

    Returns:
        The same dict with ``findings`` (and ``warnings``) filled.
    """
    import json
    from pathlib import Path

    target = Path(root) / "target.json"
    warning = json.loads(target.read_text()).get("warning") if target.is_file() else None
    if warning and section["status"] == "assessed":
        section.setdefault("warnings", []).append(warning)
        section["verdict"] = "info"
    section["findings"] = (section_findings(section, reproduce_command(root, section["section"]))
                           if section["status"] == "assessed" else [])
    return section
