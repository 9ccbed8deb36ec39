"""The one progress protocol: library code reports long work through a :class:`ProgressSink`.

Library functions take ``progress: ProgressSink | None = None`` and never print; ``None`` means
:class:`NullProgress`. Work is identified by a ``key`` (a study, a run, a training loop):

- ``start(key, total, description)`` announces it (``total=None``: unknown length),
- ``advance(key, n, info)`` reports ``n`` more units done, with an optional one-line status,
- ``done(key, info)`` says it finished (a bar jumps to its total).

The CLI supplies :class:`RichProgress` (rich bars; when the output is not a terminal — a log file, a pipe, CI —
a plain line per task every few seconds instead, ``MODELWARD_PROGRESS_SECONDS``, default 5); tests supply :class:`RecordingProgress` and assert on its
``events``. A sink must tolerate ``advance``/``done`` for a key it never saw ``start`` for (it starts it then).

Example:
    >>> rec = RecordingProgress()
    >>> rec.start("train", 3, "training"); rec.advance("train", 2, "loss 0.5"); rec.done("train")
    >>> [e[0] for e in rec.events]
    ['start', 'advance', 'done']
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


@runtime_checkable
class ProgressSink(Protocol):
    """Receives progress of long-running library work (see the module docstring)."""

    def start(self, key: str, total: int | None, description: str = "") -> None:
        """Announce work `key` of `total` units (None: unknown)."""

    def advance(self, key: str, n: int = 1, info: str = "") -> None:
        """`n` more units of `key` are done; `info` is a short status line ('' keeps the previous one)."""

    def done(self, key: str, info: str = "") -> None:
        """Work `key` is finished."""


class NullProgress:
    """A sink that ignores everything (the default wherever ``progress`` is None)."""

    def start(self, key: str, total: int | None, description: str = "") -> None:
        pass

    def advance(self, key: str, n: int = 1, info: str = "") -> None:
        pass

    def done(self, key: str, info: str = "") -> None:
        pass


@dataclass
class RecordingProgress:
    """A sink that records every call as ``(method, key, value, text)`` in ``events`` (for tests).

    ``value`` is the total for ``start``, ``n`` for ``advance`` and None for ``done``; ``text`` is the
    description or info. :meth:`completed` sums the advances of a key.
    """

    events: list[tuple[str, str, Any, str]] = field(default_factory=list)

    def start(self, key: str, total: int | None, description: str = "") -> None:
        self.events.append(("start", key, total, description))

    def advance(self, key: str, n: int = 1, info: str = "") -> None:
        self.events.append(("advance", key, n, info))

    def done(self, key: str, info: str = "") -> None:
        self.events.append(("done", key, None, info))

    def completed(self, key: str) -> int:
        """Total units advanced for `key`."""
        return sum(int(e[2]) for e in self.events if e[0] == "advance" and e[1] == key)

    def keys(self) -> list[str]:
        """Keys in the order they were started."""
        return [e[1] for e in self.events if e[0] == "start"]


class LoggingProgress:
    """A sink that writes progress as log lines: every ``start`` and ``done``, every ``advance`` of 0 units (a message:
    a job's planned work and its estimate, a new phase), and other advances with their info at most every `every`
    seconds per key, to the logger `logger` (level INFO) and, if given, appended to the file `path` with a
    timestamp.

    Args:
        path: a log file to append to (None: the logger only).
        logger: the logger's name.
        every: the least seconds between two advance lines of one key (0: every advance).

    Example:
        >>> import tempfile, os; f = os.path.join(tempfile.mkdtemp(), "progress.log")
        >>> p = LoggingProgress(f, every=0); p.start("pgd", 2, "PGD: 2 ε"); p.advance("pgd", 1, "ε = 0.1"); p.done("pgd")
        >>> [line.split(" ", 2)[2] for line in open(f).read().splitlines()]
        ['pgd: start: PGD: 2 ε', 'pgd: 1/2, ε = 0.1', 'pgd: done']
    """

    def __init__(self, path: str | Path | None = None, logger: str = "modelward.progress", every: float = 5.0) -> None:
        self.path = None if path is None else Path(path)
        self.log = logging.getLogger(logger)
        self.every = every
        self._done: dict[str, int] = {}
        self._total: dict[str, int | None] = {}
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def _write(self, line: str) -> None:
        self.log.info(line)
        if self.path is not None:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            with self._lock, self.path.open("a", encoding="utf-8") as f:
                f.write(f"{stamp} {line}\n")

    def start(self, key: str, total: int | None, description: str = "") -> None:
        self._done[key], self._total[key], self._last[key] = 0, total, time.monotonic()
        self._write(f"{key}: start: {description or key}")

    def advance(self, key: str, n: int = 1, info: str = "") -> None:
        self._done[key] = self._done.get(key, 0) + n
        now = time.monotonic()
        if n and now - self._last.get(key, 0.0) < self.every:  # n = 0: a message (a plan, a phase): always written
            return
        self._last[key] = now
        total = self._total.get(key)
        count = f"{self._done[key]}/{total}" if total else f"{self._done[key]}"
        self._write(f"{key}: {count}" + (f", {info}" if info else ""))

    def done(self, key: str, info: str = "") -> None:
        self._write(f"{key}: done" + (f": {info}" if info else ""))


class TeeProgress:
    """A sink that forwards every call to each of `sinks` (e.g. the terminal's bars and a log file)."""

    def __init__(self, *sinks: ProgressSink | None) -> None:
        self.sinks = [s for s in sinks if s is not None]

    def start(self, key: str, total: int | None, description: str = "") -> None:
        for s in self.sinks:
            s.start(key, total, description)

    def advance(self, key: str, n: int = 1, info: str = "") -> None:
        for s in self.sinks:
            s.advance(key, n, info)

    def done(self, key: str, info: str = "") -> None:
        for s in self.sinks:
            s.done(key, info)


def as_sink(progress: ProgressSink | None) -> ProgressSink:
    """`progress`, or a :class:`NullProgress` when it is None."""
    return NullProgress() if progress is None else progress


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def plain_line(task: Any) -> str:
    """One plain-text progress line for a rich task: ``description: 3/10 (30%), 0:00:12 elapsed, ~0:00:28 left,
    info`` (no bar, no control characters: for logs)."""
    done = int(task.completed)
    parts = [f"{done}/{int(task.total)} ({100 * done / task.total:.0f}%)" if task.total else f"{done}"]
    parts.append(f"{_clock(task.elapsed or 0.0)} elapsed")
    if task.total and not task.finished and task.time_remaining is not None:
        parts.append(f"~{_clock(task.time_remaining)} left")
    info = str(task.fields.get("info", "") or "")
    if info:
        parts.append(info)
    return f"{task.description}: {', '.join(parts)}"


class PlainWhenPiped(Progress):
    """A rich ``Progress`` that, when its console is not a terminal, prints :func:`plain_line` for every unfinished
    task every `every` seconds (and once per task when it finishes), so a long command in a log file is not silent.

    Args:
        every: seconds between lines (default: ``MODELWARD_PROGRESS_SECONDS`` or 5).
        *args, **kwargs: as for ``rich.progress.Progress``.
    """

    def __init__(self, *args: Any, every: float | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        env = os.environ.get("MODELWARD_PROGRESS_SECONDS", "")
        try:
            default = float(env) if env else 5.0
        except ValueError:
            default = 5.0
        self.every = max(0.05, every if every is not None else default)
        self._plain = not self.console.is_terminal
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._reported: set[Any] = set()

    def start(self) -> None:
        super().start()
        if self._plain and self._ticker is None:
            self._stop.clear()
            self._ticker = threading.Thread(target=self._tick, name="progress-lines", daemon=True)
            self._ticker.start()

    def stop(self) -> None:
        if self._ticker is not None:
            self._stop.set()
            self._ticker.join(timeout=5)
            self._ticker = None
            self._print_lines(final=True)
        super().stop()

    def _tick(self) -> None:
        while not self._stop.wait(self.every):
            self._print_lines(final=False)

    def _print_lines(self, final: bool) -> None:
        with self._lock:
            tasks = [t for t in self.tasks if t.visible]
        for t in tasks:
            if t.id in self._reported:
                continue
            if t.finished or final:
                self._reported.add(t.id)
            self.console.print(plain_line(t), markup=False, highlight=False, soft_wrap=True)


def make_progress(console: Console | None = None, transient: bool = False) -> Progress:
    """The rich ``Progress`` layout shared by every command (description, bar, n/m, elapsed, remaining, info);
    on a console that is not a terminal it also prints a plain line per task every few seconds
    (:class:`PlainWhenPiped`)."""
    return PlainWhenPiped(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
        transient=transient,
    )


class RichProgress:
    """A rich-backed sink for the CLI: one bar per key. Use as a context manager.

    Args:
        console: the rich console to draw on (None: a new one).
        transient: remove the bars when the context exits.

    Example:
        >>> with RichProgress(Console(quiet=True)) as p:
        ...     p.start("runs", 2, "study"); p.advance("runs"); p.done("runs")
    """

    def __init__(self, console: Console | None = None, transient: bool = False) -> None:
        self.progress = make_progress(console, transient)
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> RichProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)  # type: ignore[arg-type]

    def _task(self, key: str) -> TaskID:
        if key not in self._tasks:
            self._tasks[key] = self.progress.add_task(key, total=None, info="")
        return self._tasks[key]

    def start(self, key: str, total: int | None, description: str = "") -> None:
        if key in self._tasks:
            self.progress.update(self._tasks[key], total=total, description=description or key)
        else:
            self._tasks[key] = self.progress.add_task(description or key, total=total, info="")

    def advance(self, key: str, n: int = 1, info: str = "") -> None:
        task = self._task(key)
        if info:
            self.progress.update(task, advance=n, info=info)
        else:
            self.progress.update(task, advance=n)

    def done(self, key: str, info: str = "") -> None:
        task = self._task(key)
        t = next(x for x in self.progress.tasks if x.id == task)
        fields: dict[str, Any] = {"info": info} if info else {}
        if t.total is not None:
            self.progress.update(task, completed=t.total, **fields)
        else:
            self.progress.update(task, total=t.completed, **fields)
