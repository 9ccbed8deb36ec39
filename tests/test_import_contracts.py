"""The import contracts of pyproject.toml ``[tool.importlinter]`` hold: the house's layers (an area imports only
areas below it; core imports no area) and no import circle between the modules of any folder. The same check runs
in ``make lint`` as ``lint-imports``. Function-level imports of the project's own modules carry a written reason
(:func:`test_function_level_imports_of_the_project_say_why`)."""

from __future__ import annotations

import ast
import io
import os
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_contracts_are_kept() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    code = ("import sys; from importlinter.cli import lint_imports; "
            "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout and "house-layers" not in r.stdout  # ids are not printed; names are
    assert "The house's layers" in r.stdout and "No import circles" in r.stdout


# ---- function-level imports of the project's own modules (issue 25, item 5) -----------------------------------------
# An import of a modelward module inside a function hides a dependency from the module's head (and from the import
# contracts' reader); it is kept only where a reason is written: a comment on its line or on the line above it (or
# above the block of imports it belongs to, no blank line between), e.g. "# lazy: pulls in opacus (extra "privacy")",
# or, for a module whose commands import the library on call (the CLI), one file-level line "# lazy-imports: <why>".
LAZY_MARKER = "# lazy-imports:"
_PRAGMAS = ("noqa", "type:", "pragma", "fmt:", "isort:")


def _comments(source: str) -> dict[int, str]:
    """Line number -> the text of the real comment on that line (tokenize, so a '#' inside a string is not one)."""
    found: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            found[tok.start[0]] = tok.string
    return found


def _is_reason(comment: str | None) -> bool:
    """A comment that says something: not empty, not only a linter pragma such as ``# noqa: F401``."""
    if comment is None:
        return False
    text = comment.lstrip("#").strip()
    return bool(text) and not text.lower().startswith(_PRAGMAS)


def _own_module(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] == "modelward"
    return any(alias.name.split(".")[0] == "modelward" for alias in node.names)


def unexplained_function_imports(path: Path, root: Path) -> list[str]:
    """``file:line: import`` for each function-level import of a modelward module in `path` without a reason."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    comments = _comments(source)
    if any(text.startswith(LAZY_MARKER) and text[len(LAZY_MARKER):].strip()
           for line, text in comments.items() if lines[line - 1].lstrip().startswith("#")):
        return []
    tree = ast.parse(source, filename=str(path))
    # an import directly below another import (no blank line) shares the comment above their block
    ends = {n.end_lineno: n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)}

    def comment_above(node: ast.Import | ast.ImportFrom) -> str | None:
        while node.lineno - 1 in ends:
            node = ends[node.lineno - 1]
        line = node.lineno - 1
        return comments.get(line) if line >= 1 and lines[line - 1].lstrip().startswith("#") else None

    bad: list[str] = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, ast.Import | ast.ImportFrom) and _own_module(child):
                first, last = child.lineno, child.end_lineno or child.lineno
                if not any(_is_reason(c) for c in (comments.get(first), comments.get(last), comment_above(child))):
                    bad.append(f"{path.relative_to(root)}:{first}: {lines[first - 1].strip()}")
            walk(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda))

    walk(tree, False)
    return bad


def test_function_level_imports_of_the_project_say_why() -> None:
    bad = [site for path in sorted((ROOT / "src" / "modelward").rglob("*.py"))
           for site in unexplained_function_imports(path, ROOT)]
    assert not bad, ("function-level imports of modelward modules need a reason (a comment on the line or the line "
                     "above, or a file-level '# lazy-imports: <reason>' marker); move them to the module's top "
                     "where nothing argues for laziness:\n" + "\n".join(bad))


def test_the_function_import_check_can_fail(tmp_path: Path) -> None:
    pkg = tmp_path / "src" / "modelward"
    pkg.mkdir(parents=True)
    (pkg / "quiet.py").write_text(
        "import json\n\n\ndef f():\n    import os\n\n    from modelward.core import seed\n"
        "    from . import sibling  # noqa: F401\n    return seed, os, json\n\n\nclass C:\n"
        "    def m(self):\n        # lazy: keeps this module light\n        from modelward.core.plots import plt\n"
        "        from modelward.core.io import (  # lazy: the reason may sit on the first line\n"
        "            load_tensors,\n        )\n        return plt, load_tensors\n\n    def n(self):\n"
        "        # lazy: one reason for the block below\n        from modelward.core import io\n"
        "        from modelward.core import seed\n\n        from modelward.core import zoo\n"
        "        return io, seed, zoo\n")
    (pkg / "marked.py").write_text("# lazy-imports: commands import the library on call\n\n\n"
                                   "def g():\n    from modelward.core import seed\n    return seed\n")
    (pkg / "empty_marker.py").write_text("# lazy-imports:\n\n\ndef g():\n    import modelward.core\n"
                                         "    return modelward.core\n")
    (pkg / "in_string.py").write_text('def h():\n    s = "# lazy: not a comment"\n'
                                      "    from modelward.core import seed\n    return s, seed\n")
    found = [site for path in sorted(pkg.glob("*.py")) for site in unexplained_function_imports(path, tmp_path)]
    assert found == [
        "src/modelward/empty_marker.py:5: import modelward.core",
        "src/modelward/in_string.py:3: from modelward.core import seed",
        "src/modelward/quiet.py:7: from modelward.core import seed",
        "src/modelward/quiet.py:8: from . import sibling  # noqa: F401",
        "src/modelward/quiet.py:26: from modelward.core import zoo",
    ], found
