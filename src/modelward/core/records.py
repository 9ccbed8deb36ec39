"""The one result writer: a results table as CSV + Markdown + JSON, each written atomically.

Reports are assembled from these files (never from in-memory state), so a writer must never leave a half-written
file behind: every file is written to a temporary sibling and moved into place with ``os.replace``.

Formats (stable, the tests and reports rely on them):

- CSV: ``csv.DictWriter`` with the given columns (missing values empty, extra keys ignored); floats as ``str()``
  (the full ``repr``, so a CSV round-trips exactly).
- Markdown: ``# title``, a blank line, a pipe table (floats with `float_digits` decimals, or — for non-zero values
  below 5·10^−`float_digits` — `float_digits` significant digits, so δ = 1e-5 reads ``1e-05``, not ``0.0000``;
  None as ``—``), then
  the notes, one per line after a blank line. A caller with a pivot layout passes its own ``markdown=`` body.
- JSON: the list of rows, indent 2; NaN/inf become null (strict JSON).

Example:
    >>> import tempfile
    >>> paths = write_table(tempfile.mkdtemp(), "scores", [{"model": "a", "acc": 0.5}], title="Scores")
    >>> sorted(paths)
    ['csv', 'json', 'md']
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def current_umask() -> int:
    """The process's umask, read without changing it where the OS allows (``/proc/self/status`` on Linux; elsewhere
    set-and-restore, which is not thread-safe but brief)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write `text` to `path` (UTF-8) atomically: readers see the old file or the new one, never a part.

    The file gets the mode any new file of the user gets (0666 less the umask: readable by a colleague or a web
    server where the umask allows), not the 0600 of a temporary file. A write that fails (a full disk) names the
    file in its ``OSError`` and leaves the old file in place.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        if e.filename is None:
            raise OSError(e.errno, e.strerror, str(path)) from None
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _strict(obj: Any) -> Any:
    """NaN/inf -> None, recursively (strict JSON has no NaN)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strict(v) for v in obj]
    return obj


def atomic_write_json(path: str | Path, obj: Any, indent: int | None = 2) -> Path:
    """Write `obj` as strict JSON (NaN/inf -> null) plus a trailing newline, atomically."""
    return atomic_write_text(path, json.dumps(_strict(obj), indent=indent, allow_nan=False, default=str) + "\n")


def table_columns(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Column names: the keys of all rows, in order of first appearance."""
    return list(dict.fromkeys(k for r in rows for k in r))


def csv_text(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """The CSV text of `rows` (header first); see the module docstring for the format."""
    cols = list(columns) if columns is not None else table_columns(rows)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def write_csv(path: str | Path, rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> Path:
    """Write `rows` as one CSV file atomically (for plain data files such as curves; tables use write_table)."""
    return atomic_write_text(path, csv_text(rows, columns))


def _fmt(v: Any, float_digits: int) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        text = f"{v:.{float_digits}f}"
        # a small non-zero value (δ = 1e-5) is not written as 0.0000: it keeps `float_digits` significant digits
        if v == v and v != 0 and abs(v) < 0.5 * 10.0 ** -(float_digits - 1):
            return f"{v:.{float_digits}g}"
        return text
    return str(v)


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None,
                   float_digits: int = 4) -> str:
    """A Markdown pipe table (header, ``|---|`` rule, one line per row), ending with a newline.

    Args:
        rows: the table rows; a missing key renders as ``—``.
        columns: the columns in order (default: all keys in order of first appearance).
        float_digits: decimals for floats (ints and strings are printed as they are).
    """
    cols = list(columns) if columns is not None else table_columns(rows)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c), float_digits) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def write_table(out_dir: str | Path, name: str, rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None,
                *, title: str | None = None, notes: Sequence[str] | None = None, float_digits: int = 4,
                markdown: str | None = None) -> dict[str, Path]:
    """Write ``<name>.csv``, ``<name>.md`` and ``<name>.json`` in `out_dir`, each atomically.

    Args:
        out_dir: the run directory (created if missing).
        name: the file stem.
        rows: one dict per row (JSON-able values).
        columns: column order (default: all keys, first-appearance order); rows' other keys are left out.
        title: Markdown heading (``# title``).
        notes: lines printed under the Markdown table.
        float_digits: decimals of floats in the Markdown table (CSV and JSON keep full precision).
        markdown: a complete Markdown document to write instead of the generated one (pivot layouts).

    Returns:
        ``{"csv": path, "md": path, "json": path}``.
    """
    out = Path(out_dir)
    cols = list(columns) if columns is not None else table_columns(rows)
    if markdown is None:
        markdown = (f"# {title}\n\n" if title else "") + markdown_table(rows, cols, float_digits)
        if notes:
            markdown += "\n" + "\n".join(notes) + "\n"
    return {
        "csv": write_csv(out / f"{name}.csv", rows, cols),
        "md": atomic_write_text(out / f"{name}.md", markdown),
        "json": atomic_write_json(out / f"{name}.json", [{c: r.get(c) for c in cols} for r in rows]),
    }
