"""Model-file scanning without loading (OWASP ML06, MITRE ATLAS AML.T0010 / AML.T0011): ``modelward scan PATH...``.

Example:
    >>> from modelward.scan import scan_file
    >>> report = scan_file("model.pt")  # doctest: +SKIP
    >>> report.clean, [i.detail for i in report.issues]  # doctest: +SKIP
"""

from modelward.core.registry import lazy_exports

_EXPORTS = {"scan_file": "modelward.scan.scanner:scan_file", "scan_paths": "modelward.scan.scanner:scan_paths",
            "FileScan": "modelward.scan.scanner:FileScan", "ScanIssue": "modelward.scan.scanner:ScanIssue",
            "load_checked_torch_file": "modelward.scan.scanner:load_checked_torch_file",
            "conversion_command": "modelward.scan.scanner:conversion_command",
            "scan_exit_code": "modelward.scan.scanner:scan_exit_code",
            "scan_hf_folder": "modelward.scan.hf_folder:scan_hf_folder"}  # issue 39: Hugging Face model folders
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
