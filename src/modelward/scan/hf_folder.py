"""Hugging Face model folders (``save_pretrained``): what loading one would run or read, found without loading it.

A folder is examined file by file: weight files with :func:`~modelward.scan.scanner.scan_file` (safetensors headers;
pickles disassembled by picklescan), plus three things only a folder has:

- ``config.json`` with ``auto_map``: the model's classes are Python files of the folder (or of another repository),
  which ``trust_remote_code=True`` would import: *high* (modelward never sets it);
- ``*.py`` files in the folder: code shipped with the weights: *high*;
- pickled weights (``pytorch_model.bin``, ``*.pt``/``*.pth``/``*.ckpt``/``*.pkl``) even when picklescan finds no
  unsafe global: *low*, "a pickle: prefer safetensors" (a reader of the folder must trust the unpickler; safetensors
  cannot run code), with the conversion command.

A ``config.json`` that is not valid JSON is *medium* (malformed). Tokenizer and other JSON/text files are not model
code and are not reported.

Example:
    >>> scans = scan_hf_folder("examples/text_classifier/model")  # doctest: +SKIP
    >>> [(s.path, s.clean) for s in scans]  # doctest: +SKIP
"""

from __future__ import annotations

import json
from pathlib import Path

from modelward.errors import DataError
from modelward.scan.scanner import (
    PICKLE_SUFFIXES,
    FileScan,
    ScanIssue,
    conversion_command,
    scan_file,
    sha256_file,
)

WEIGHT_SUFFIXES = (".safetensors", *PICKLE_SUFFIXES)


def is_hf_folder(path: str | Path) -> bool:
    """A folder with a ``config.json``: what ``save_pretrained`` writes."""
    p = Path(path)
    return p.is_dir() and (p / "config.json").is_file()


def _config_scan(path: Path) -> FileScan:
    scan = FileScan(str(path), "json", sha256_file(path), path.stat().st_size)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        scan.issues.append(ScanIssue(str(path), "malformed", "medium", f"config.json is not valid JSON ({e})"))
        return scan
    auto = raw.get("auto_map") if isinstance(raw, dict) else None
    if auto:
        targets = sorted({str(v) for v in (auto.values() if isinstance(auto, dict) else [auto])})
        scan.issues.append(ScanIssue(str(path), "remote_code", "high",
                                     f"auto_map names the model's own Python classes ({', '.join(targets[:4])}): "
                                     "loading it with trust_remote_code=True imports and runs that code"))
    return scan


def scan_hf_folder(folder: str | Path) -> list[FileScan]:
    """Scan a Hugging Face model folder without loading anything (see the module docstring).

    Args:
        folder: a ``save_pretrained`` folder (with a ``config.json``).

    Returns:
        One :class:`~modelward.scan.scanner.FileScan` for ``config.json``, for every weight file and for every
        Python file found (sub-folders included), in sorted order.

    Raises:
        DataError: the folder does not exist or has no ``config.json``.
    """
    root = Path(folder)
    if not is_hf_folder(root):
        raise DataError(f"{root.resolve()}: not a Hugging Face model folder (no config.json)")
    out = [_config_scan(root / "config.json")]
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        if f.suffix == ".py":
            scan = FileScan(str(f), "python", sha256_file(f), f.stat().st_size)
            scan.issues.append(ScanIssue(str(f), "code", "high", "Python code shipped in the model folder (what "
                                         "auto_map / trust_remote_code would import)"))
            out.append(scan)
        elif f.suffix in WEIGHT_SUFFIXES:
            scan = scan_file(f)
            if scan.format != "safetensors" and f.suffix in PICKLE_SUFFIXES and scan.clean:
                scan.issues.append(ScanIssue(str(f), "pickle_format", "low",
                                             "pickled weights: reading them needs an unpickler (safetensors cannot "
                                             f"run code); convert them: {conversion_command(f)}"))
            out.append(scan)
    return out
