"""Proof of ownership and extraction detection for a served model (issue #30).

- :class:`AnswerWatermark` (DAWN-style keyed answer watermark) and :func:`watermark_p_value`;
- :class:`Fingerprint` / :func:`make_fingerprint` (IPGuard-style boundary fingerprint with a calibrated null);
- :func:`verify_ownership` with :class:`LocalSuspect` / :class:`HttpSuspect`;
- :class:`PradaDetector` (PRADA: per-client query-distance normality test).
"""

from modelward.core.registry import lazy_exports

_P = "modelward.extraction.ownership"
_EXPORTS = {
    "AnswerWatermark": f"{_P}.watermark:AnswerWatermark", "watermark_p_value": f"{_P}.watermark:watermark_p_value",
    "new_key": f"{_P}.watermark:new_key", "load_or_create_key": f"{_P}.watermark:load_or_create_key",
    "Fingerprint": f"{_P}.fingerprint:Fingerprint", "make_fingerprint": f"{_P}.fingerprint:make_fingerprint",
    "boundary_points": f"{_P}.fingerprint:boundary_points", "random_seeds": f"{_P}.fingerprint:random_seeds",
    "PradaDetector": f"{_P}.detector:PradaDetector", "DetectorVerdict": f"{_P}.detector:DetectorVerdict",
    "verify_ownership": f"{_P}.verify:verify_ownership", "LocalSuspect": f"{_P}.verify:LocalSuspect",
    "HttpSuspect": f"{_P}.verify:HttpSuspect", "WatermarkRecords": f"{_P}.verify:WatermarkRecords",
    "OwnershipReport": f"{_P}.verify:OwnershipReport", "WatermarkedVictim": f"{_P}.local:WatermarkedVictim",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
