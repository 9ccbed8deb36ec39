"""What a scan reports: one :class:`FileScan` per file given or walked, with its :class:`ScanIssue` s."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Severity = Literal["critical", "high", "medium", "low"]
SEVERITY_ORDER: tuple[Severity, ...] = ("critical", "high", "medium", "low")


@dataclass
class ScanIssue:
    """One reason a file is not clean.

    Attributes:
        where: the file, or ``file:member`` inside an archive.
        kind: ``unsafe_global`` | ``nested_archive`` | ``malformed`` | ``unsafe_layer`` (a Keras Lambda) |
            ``custom_op`` (ONNX / TensorFlow ops a native library must provide) | ``unsafe_op`` (file or Python
            access in a graph) | ``external_data`` | ``unsafe_template`` (GGUF) | ``not_scanned``.
        severity: ``critical`` | ``high`` | ``medium`` | ``low``.
        detail: one line for people.
        module, name: the imported global (``unsafe_global`` only).
    """

    where: str
    kind: str
    severity: Severity
    detail: str
    module: str = ""
    name: str = ""


@dataclass
class FileScan:
    """What a scan found in one file (nothing of it was loaded).

    Attributes:
        path: the file; format: ``safetensors`` | ``torch_zip`` | ``zip`` | ``pickle`` | ``numpy`` | ``keras_h5`` |
            ``hdf5`` | ``keras`` | ``onnx`` | ``tf_savedmodel`` | ``tf_data`` | ``gguf`` | ``unknown``.
        sha256, size: the file's digest and size in bytes.
        globals: every ``module.name`` the file's pickles import (allowlisted ones included).
        issues: why it is not clean (empty: clean); scanner: the library and version that read the pickles.
    """

    path: str
    format: str
    sha256: str
    size: int
    globals: list[str] = field(default_factory=list)
    issues: list[ScanIssue] = field(default_factory=list)
    scanner: str = ""

    @property
    def scanned(self) -> bool:
        """False when the file's format was not recognised (or a reader it needs is missing): nothing was checked."""
        return not any(i.kind == "not_scanned" for i in self.issues)

    @property
    def clean(self) -> bool:
        """Scanned, and nothing found (a file that was not scanned is never called clean)."""
        return not self.issues

    @property
    def unsafe(self) -> bool:
        """Scanned, and something found: what `modelward scan` always fails on."""
        return self.scanned and bool(self.issues)

    @property
    def severity(self) -> Severity | None:
        return min((i.severity for i in self.issues), key=SEVERITY_ORDER.index, default=None)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "clean": self.clean, "scanned": self.scanned, "severity": self.severity}


