"""``notebook-kit export``: a notebook's code cells as a script for ``notebook-kit launch``.

What is kept, cell by cell (code cells only, in notebook order):

- A cell tagged ``skip-export`` is left out.
- A cell magic drops the cell (``%%bash``, ``%%html``, ...), except ``%%time`` and
  ``%%capture``, whose body is ordinary Python and is kept.
- Line magics and shell lines (``%matplotlib``, ``!pip``, ``x = !ls``) are dropped;
  ``%time statement`` keeps the statement. A magic inside a block cannot be dropped without
  changing the block, so it is an error that names the cell.
- Display-only statements are dropped: at the top level of a cell, an expression that is a
  name, an attribute, a subscript or a literal (the value the kernel shows as the cell's
  result), or a call of ``display(...)`` or ``....show(...)``. A cell left with nothing to run
  is dropped as display-only.
- ``await notebook_launcher_async(...)`` becomes ``asyncio.run(notebook_launcher_async(...))``.

The cells from the first one that calls ``notebook_launcher`` (or ``notebook_launcher_async``)
go into ``main()``, run under ``if __name__ == "__main__":``. Names they bind are declared
``global``, so they behave as notebook variables. Under torchrun every process returns from
the launch call (see :func:`notebook_kit.notebook_launcher`), so the code after the last
launch call runs only where ``LOCAL_RANK`` is 0 or unset: once per node, as in the kernel.
The cells before it run on every process (they define what the launch needs); what they
print goes to standard output only where ``LOCAL_RANK`` is 0 or unset, so it too shows once
per node. Errors (standard error) show on every process.
"""

from __future__ import annotations

import ast
import io
import os
import symtable
import tokenize
from dataclasses import dataclass, replace
from pathlib import Path

import nbformat

from notebook_kit.cli.notebook_file import NotebookFileError, read_notebook

__all__ = ["ExportError", "ExportResult", "export_notebook", "notebook_to_script"]

SKIP_TAG = "skip-export"
_PYTHON_CELL_MAGICS = ("time", "capture")
_LAUNCHERS = ("notebook_launcher", "notebook_launcher_async")
_INDENT = "    "
_GUARD_FUNCTION = '''def _first_process_of_node() -> bool:
    """Under torchrun every process returns from the launch; the rest of the notebook runs
    on one process per node, as it runs in the kernel."""
    import os

    return os.environ.get("LOCAL_RANK", "0") == "0"'''
_QUIET_FUNCTION = '''def _print_once_per_node():
    """Under torchrun the cells above the launch run on every process; what they print shows
    once per node, as in the kernel (errors show everywhere). Closing the stack ends it."""
    import contextlib
    import os

    stack = contextlib.ExitStack()
    if not _first_process_of_node():
        stack.enter_context(contextlib.redirect_stdout(stack.enter_context(open(os.devnull, "w"))))
    return stack


_top_level_output = _print_once_per_node()'''
_QUIET_END = "_top_level_output.close()"


class ExportError(ValueError):
    """The notebook cannot become a runnable script; the message names the cell."""


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_notebook` wrote.

    Attributes:
        path: The script written.
        kept: Numbers (1-based, among all cells) of the cells in the script.
        dropped: ``(cell number, reason)`` for every code cell left out.
        has_main: Whether a launch call was found and ``main()`` written.
    """

    path: Path
    kept: tuple[int, ...]
    dropped: tuple[tuple[int, str], ...]
    has_main: bool

    def summary(self) -> str:
        """What happened, in a few lines.

        Example:
            >>> ExportResult(Path("t.py"), (2,), ((3, "display only"),), True).summary()
            'Wrote t.py from 1 code cell(s); left out cell 3 (display only).'
        """
        text = f"Wrote {self.path} from {len(self.kept)} code cell(s)"
        if self.dropped:
            text += "; left out " + ", ".join(f"cell {n} ({why})" for n, why in self.dropped)
        if not self.has_main:
            text += ". No notebook_launcher call was found: every process runs the whole script"
        return text + "."


def _parse(source: str, where: str) -> ast.Module:
    try:
        return ast.parse(source, filename=where)
    except SyntaxError as error:
        try:  # a notebook may await at the top level; say so precisely below
            flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
            return compile(source, where, "exec", flags=flags)
        except SyntaxError:
            raise ExportError(f"{where}: {error.msg} (line {error.lineno}).") from error


def _call_name(call: ast.Call) -> str | None:
    """The called name: ``f`` for ``f(...)`` and ``obj.f(...)``; None for other callees."""
    func = call.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)


def _calls(node: ast.AST, names: tuple[str, ...]) -> bool:
    """Whether ``node`` contains a call of a function named one of ``names``."""
    return any(
        isinstance(inner, ast.Call) and _call_name(inner) in names for inner in ast.walk(node)
    )


def _is_display_only(statement: ast.stmt) -> bool:
    if not isinstance(statement, ast.Expr):
        return False
    value = statement.value
    if isinstance(value, (ast.Name, ast.Attribute, ast.Subscript, ast.Constant)):
        return True
    if isinstance(value, ast.Call):
        name = _call_name(value)
        return name == "display" or (isinstance(value.func, ast.Attribute) and name == "show")
    return False


def _magic_statement(statement: ast.stmt) -> tuple[str, str] | None:
    """``(magic, argument)`` for an IPython call left by the input transformer, else None."""
    if not _calls(statement, ("get_ipython",)):
        return None
    call = statement.value if isinstance(statement, ast.Expr) else None
    if (
        isinstance(call, ast.Call)
        and getattr(call.func, "attr", "") == "run_line_magic"
        and all(isinstance(arg, ast.Constant) for arg in call.args[:2])
        and len(call.args) >= 2
    ):
        return str(call.args[0].value), str(call.args[1].value)
    return "", ""


def _position(lines: list[str], line: int, column: int) -> int:
    """Character offset in ``"\n".join(lines)`` of an ast position (columns count bytes)."""
    before = sum(len(text) + 1 for text in lines[: line - 1])
    return before + len(lines[line - 1].encode()[:column].decode(errors="ignore"))


def _rewrite_await(text: str, statement: ast.stmt, where: str) -> list[str]:
    """``await notebook_launcher_async(...)`` -> ``asyncio.run(notebook_launcher_async(...))``."""
    awaits = [node for node in ast.walk(statement) if isinstance(node, ast.Await)]
    if len(awaits) != 1 or not _calls(awaits[0].value, ("notebook_launcher_async",)):
        raise ExportError(
            f"{where} line {statement.lineno}: top-level await runs only in a notebook. "
            "Call notebook_launcher instead, or tag the cell skip-export."
        )
    node, lines = awaits[0], text.split("\n")
    last = statement.end_lineno or statement.lineno
    start, end = (
        _position(lines, statement.lineno, 0),
        _position(lines, last, len(lines[last - 1].encode())),
    )
    begin = _position(lines, node.lineno, node.col_offset)
    finish = _position(lines, node.end_lineno or node.lineno, node.end_col_offset or 0)
    call = ast.get_source_segment(text, node.value) or ""
    rewritten = f"{text[start:begin]}asyncio.run({call}){text[finish:end]}"
    return ["import asyncio", *rewritten.split("\n")]


def _clean_cell(source: str, where: str) -> tuple[str, str | None]:
    """The cell's runnable code, or ``("", reason)`` when nothing of it is kept."""
    from IPython.core.inputtransformer2 import TransformerManager

    stripped = source.lstrip()
    if stripped.startswith("%%"):
        magic = stripped[2:].split(None, 1)[0] if stripped[2:].strip() else ""
        if magic not in _PYTHON_CELL_MAGICS:
            return "", f"%%{magic} cell magic"
        source = stripped.split("\n", 1)[1] if "\n" in stripped else ""
    text = TransformerManager().transform_cell(source)
    lines = text.split("\n")
    replacements: dict[int, list[str]] = {}  # first line -> new lines (empty: drop)
    kept = 0
    for statement in _parse(text, where).body:
        magic = _magic_statement(statement)
        first, last = statement.lineno, statement.end_lineno or statement.lineno
        if magic is not None and not isinstance(statement, ast.Expr | ast.Assign):
            inner = [n for n in ast.walk(statement) if _calls(n, ("get_ipython",))][-1]
            line = getattr(inner, "lineno", first)
            raise ExportError(
                f"{where} line {line}: an IPython magic or shell command inside a block "
                "cannot run in a script. Move it to its own line, or tag the cell skip-export."
            )
        if magic is not None and magic[0] == "time":
            new = magic[1].split("\n")
        elif magic is not None or _is_display_only(statement):
            new = []
        elif any(isinstance(node, ast.Await) for node in ast.walk(statement)):
            new = _rewrite_await(text, statement, where)
        else:
            kept += 1
            continue
        kept += bool(new)
        replacements[first] = new
        for number in range(first + 1, last + 1):
            replacements[number] = []
    if not kept:
        return "", "display only" if source.strip() else "empty"
    out: list[str] = []
    for number, line in enumerate(lines, start=1):
        out.extend(replacements.get(number, [line]))
    return "\n".join(out).strip("\n"), None


def _indent(code: str) -> str:
    """Indent every line of ``code`` except those inside multi-line strings."""
    inside: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(code).readline):
        (start, _), (end, _) = token.start, token.end
        inside.update(range(start + 1, end + 1))
    return "\n".join(
        line if number in inside or not line.strip() else _INDENT + line
        for number, line in enumerate(code.split("\n"), start=1)
    )


def _main_function(cells: list[str]) -> str:
    """``def main()`` holding ``cells``; after the last launch call only local rank 0 goes on."""
    body = "\n\n".join(cells)
    tree = _parse(body, "main()")
    launches = [s for s in tree.body if _calls(s, _LAUNCHERS)]
    last = launches[-1].end_lineno or launches[-1].lineno
    lines = body.split("\n")
    if any(statement.lineno > last for statement in tree.body):
        guard = ["if not _first_process_of_node():", f"{_INDENT}return"]
        lines = [*lines[:last], *guard, *lines[last:]]
    body = "\n".join(lines)
    table = symtable.symtable(body, "main()", "exec")
    bound = sorted(
        symbol.get_name()
        for symbol in table.get_symbols()
        if symbol.is_assigned() or symbol.is_imported()
    )
    header = ["def main() -> None:"]
    if bound:
        header.append(f"{_INDENT}global {', '.join(bound)}  # notebook variables stay global")
    return "\n".join(header) + "\n" + _indent(body)


def notebook_to_script(
    notebook: nbformat.NotebookNode, name: str = "notebook"
) -> tuple[str, ExportResult]:
    """The script text for ``notebook`` and what went into it (``path`` is ``Path(name)``).

    Raises:
        ExportError: A cell cannot run as a script (the message names it).

    Example:
        >>> nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1\\nx")])
        >>> notebook_to_script(nb)[0].splitlines()[-1]
        'x = 1'
    """
    module: list[str] = []
    main: list[str] = []
    kept: list[int] = []
    dropped: list[tuple[int, str]] = []
    for index, cell in enumerate(notebook.cells, start=1):
        if cell.cell_type != "code":
            continue
        if SKIP_TAG in cell.get("metadata", {}).get("tags", []):
            dropped.append((index, f"tagged {SKIP_TAG}"))
            continue
        code, reason = _clean_cell(cell.source, f"cell {index}")
        if reason is not None:
            dropped.append((index, reason))
            continue
        target = main if main or _calls(_parse(code, f"cell {index}"), _LAUNCHERS) else module
        target.append(f"# %% cell {index}\n{code}")
        kept.append(index)
    parts = [f'"""Exported from {name} by `notebook-kit export`."""']
    if not main:
        parts += module
    else:
        parts += [_GUARD_FUNCTION, *([_QUIET_FUNCTION, *module, _QUIET_END] if module else [])]
        parts += [_main_function(main), 'if __name__ == "__main__":\n    main()']
    script = "\n\n\n".join(parts) + "\n"
    try:
        compile(script, name, "exec")
    except SyntaxError as error:
        raise ExportError(
            f"The exported script does not compile ({error.msg}, script line {error.lineno}); "
            "tag the offending cell skip-export."
        ) from error
    return script, ExportResult(Path(name), tuple(kept), tuple(dropped), bool(main))


def export_notebook(
    notebook: str | os.PathLike[str], output: str | os.PathLike[str] | None = None
) -> ExportResult:
    """Write the script for the notebook at ``notebook`` (default output: same name, ``.py``).

    Raises:
        FileNotFoundError: There is no such notebook.
        ExportError: A cell cannot run as a script, or the file is not a notebook.

    Example::

        export_notebook("notebooks/01_quickstart.ipynb", "train.py").has_main
        # True
    """
    source = Path(notebook)
    try:
        nb = read_notebook(source)
    except NotebookFileError as error:
        raise ExportError(str(error)) from error
    target = Path(output) if output is not None else source.with_suffix(".py")
    script, result = notebook_to_script(nb, source.name)
    target.write_text(script, encoding="utf-8")
    return replace(result, path=target)
