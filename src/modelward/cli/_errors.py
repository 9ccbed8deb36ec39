"""How every `modelward` entry point ends on a ModelwardError: one red line, exit code 2, no traceback
(``--debug`` or ``MODELWARD_DEBUG=1`` re-raises). ``--trust-code``, anywhere on the line, lets configs run the
entry points they name (:mod:`modelward.core.entrypoints`). Light on purpose: the party server's own entry point
(``python -m modelward.cli.party``) uses it without importing every command group."""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable
from typing import Any

from modelward.errors import ModelwardError


def run_app(app: Any, argv: list[str] | None = None, prog_name: str = "modelward") -> None:
    """Run a typer app; a ModelwardError prints ``error: <message>`` on stderr and exits with code 2."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or os.environ.get("MODELWARD_DEBUG") == "1"
    if "--trust-code" in args:  # a global switch, like --debug: configs may run their entry points (code)
        # lazy: only with --trust-code; `modelward --help` imports this module and stays light
        from modelward.core.entrypoints import trust_code

        trust_code()
    args = [a for a in args if a not in ("--debug", "--trust-code")]
    restore = _wide_when_piped()
    try:
        app(args, prog_name=prog_name)
    except ModelwardError as e:
        if debug:
            raise
        _print_error(str(e))
        sys.exit(2)
    except OSError as e:
        if debug or e.errno not in _NO_SPACE:
            raise
        # a full disk (or quota, or file-size limit) is the operator's to fix, not a bug: one line, no traceback
        where = f"cannot write {e.filename}" if e.filename else "cannot write a file"
        _print_error(f"{where}: {e.strerror or e}. Free some space and run the same command again (finished runs "
                     "and checkpoints are kept)")
        sys.exit(2)
    finally:
        restore()  # (for callers that run several commands in one process, e.g. tests)


_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)

#: rich's width when stdout is not a terminal (a log, a pipe): wide enough that no table column is cut
PIPED_COLUMNS = 1000


def _wide_when_piped() -> Callable[[], None]:
    """Not on a terminal, rich would wrap and cut every table at 80 columns ("bayesian…"): give the consoles the
    commands create a width no table reaches (``COLUMNS``, unless the user set it), while ``--help`` keeps a
    readable width. Called before the command modules are imported, so their consoles see it. Returns the undo."""
    if sys.stdout.isatty() or "COLUMNS" in os.environ:
        return lambda: None
    os.environ["COLUMNS"] = str(PIPED_COLUMNS)
    rich_utils: Any = None
    try:
        from typer import rich_utils

        if rich_utils.MAX_WIDTH is not None:
            rich_utils = None
        else:  # typer's help panels would otherwise stretch to the new width
            rich_utils.MAX_WIDTH = 100
    except ImportError:  # pragma: no cover - typer without rich
        rich_utils = None

    def restore() -> None:
        os.environ.pop("COLUMNS", None)
        if rich_utils is not None:
            rich_utils.MAX_WIDTH = None

    return restore


def _print_error(message: str) -> None:
    from rich.console import Console
    from rich.markup import escape

    # escape: messages quote TOML tables like [data] or [[evaluate.attacks]], which rich reads as markup
    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {escape(message)}", highlight=False)
