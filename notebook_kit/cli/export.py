"""``notebook-kit export``: a notebook's code cells as a script for ``notebook-kit launch``.

``docs/scale_out.md`` says what is kept, what runs once per node and what is refused. Beyond
it: a magic inside a block cannot be dropped without changing the block, so it is an error
naming the cell; a tuple of display-only expressions is display-only too; the names the cells
in ``main()`` bind are declared ``global``, so they behave as notebook variables; and errors
(standard error) show on every process. What only a kernel can run is found by
:mod:`notebook_kit.cli.export_checks`.
"""

from __future__ import annotations

import ast
import io
import os
import symtable
import tokenize
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import nbformat

from notebook_kit.cli.export_checks import (
    JOB_FOLDER,
    Cell,
    call_name,
    kernel_only_cells,
    launch_test,
    launch_warnings,
    launches,
    position,
    refusal,
    share_folders_until_the_last_launch,
)
from notebook_kit.cli.notebook_file import NotebookFileError, read_notebook

__all__ = ["ExportError", "ExportResult", "export_notebook", "notebook_to_script"]

SKIP_TAG = "skip-export"
_PYTHON_CELL_MAGICS = ("time", "capture")
_INDENT = "    "
_GUARD_FUNCTION = '''def _first_process_of_node() -> bool:
    """Under torchrun every process returns from the launch; the rest of the notebook runs
    on one process per node, as it runs in the kernel."""
    import os

    return os.environ.get("LOCAL_RANK", "0") == "0"'''
_PREAMBLE = f"""from notebook_kit.cli.script_entry import job_temporary_folder as {JOB_FOLDER}
from notebook_kit.cli.script_entry import join_job_group, print_once_per_node

# Under torchrun every process runs this script: what the notebook prints shows once per
# node, as in the kernel, and what its launches print on every process.
print_once_per_node()
# The cells below make their temporary folders once for the job, which needs the job's
# process group first; every launch then runs in it.
join_job_group()"""


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
        warnings: What runs differently from the kernel, or not at all, each naming its cell.
    """

    path: Path
    kept: tuple[int, ...]
    dropped: tuple[tuple[int, str], ...]
    has_main: bool
    warnings: tuple[str, ...] = ()

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
        return text + "." + "".join(f"\nwarning: {warning}" for warning in self.warnings)


def _parse(source: str, where: str) -> ast.Module:
    try:
        return ast.parse(source, filename=where)
    except SyntaxError as error:
        try:  # a notebook may await at the top level; say so precisely below
            flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
            return compile(source, where, "exec", flags=flags)
        except SyntaxError:
            raise ExportError(f"{where}: {error.msg} (line {error.lineno}).") from error


def _calls(node: ast.AST, names: tuple[str, ...]) -> bool:
    """Whether ``node`` contains a call of a function named one of ``names``."""
    return any(
        isinstance(inner, ast.Call) and call_name(inner) in names for inner in ast.walk(node)
    )


def _is_display_only(statement: ast.stmt) -> bool:
    if not isinstance(statement, ast.Expr):
        return False
    value = statement.value
    if isinstance(value, (ast.Name, ast.Attribute, ast.Subscript, ast.Constant)):
        return True
    if isinstance(value, ast.Tuple):  # ``a, b.c``: the kernel shows the pair
        return all(_is_display_only(ast.Expr(element)) for element in value.elts)
    if isinstance(value, ast.Call):
        name = call_name(value)
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
        position(lines, statement.lineno, 0),
        position(lines, last, len(lines[last - 1].encode())),
    )
    begin = position(lines, node.lineno, node.col_offset)
    finish = position(lines, node.end_lineno or node.lineno, node.end_col_offset or 0)
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


def _main_function(cells: list[str], is_launch: Callable[[ast.Call], bool]) -> str:
    """``def main()`` holding ``cells``; after the last launch call only local rank 0 goes on."""
    body = "\n\n".join(cells)
    tree = _parse(body, "main()")
    launching = [s for s in tree.body if launches(s, is_launch)]
    last = launching[-1].end_lineno or launching[-1].lineno
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


def _kept_cells(notebook: nbformat.NotebookNode) -> tuple[list[Cell], list[tuple[int, str]]]:
    """The code cells that become script code, and why each other code cell was left out;
    a cell that cannot run as a script is refused (:func:`export_checks.refusal`)."""
    cells: list[Cell] = []
    dropped: list[tuple[int, str]] = []
    sources: list[tuple[int, str, str | None]] = []
    for index, cell in enumerate(notebook.cells, start=1):
        if cell.cell_type != "code":
            continue
        if SKIP_TAG in cell.get("metadata", {}).get("tags", []):
            dropped.append((index, f"tagged {SKIP_TAG}"))
            continue
        code, reason = _clean_cell(cell.source, f"cell {index}")
        sources.append((index, cell.source, None if reason else code))
        if reason is not None:
            dropped.append((index, reason))
        else:
            cells.append(Cell(index, cell.source, code))
    is_launch = launch_test([cell.code for cell in cells])
    for index, source, code in sources:
        tree = None if code is None else _parse(code, f"cell {index}")
        problem = refusal(index, source, tree, is_launch)
        if problem is not None:
            raise ExportError(f"{problem} Nothing was written.")
    return cells, dropped


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
    cells, dropped = _kept_cells(notebook)
    is_launch = launch_test([cell.code for cell in cells])
    try:
        kernel_only = kernel_only_cells(cells, is_launch)
    except ValueError as error:
        raise ExportError(str(error)) from error
    warnings = [
        f"left out {c.named}: {kernel_only[c.number]}." for c in cells if c.number in kernel_only
    ]
    dropped += [(number, "needs the kernel, see the warning") for number in kernel_only]
    cells = [cell for cell in cells if cell.number not in kernel_only]
    for cell in cells:
        warnings += launch_warnings(cell, is_launch)
    launching = [i for i, c in enumerate(cells) if launches(_parse(c.code, "cell"), is_launch)]
    module, main = cells, []
    if launching:
        cells, shared = share_folders_until_the_last_launch(cells, launching[-1], is_launch)
        warnings += shared
        module, main = cells[: launching[0]], cells[launching[0] :]
    script = _script_text(name, module, main, is_launch)
    kept = tuple(cell.number for cell in cells)
    result = ExportResult(Path(name), kept, tuple(sorted(dropped)), bool(main), tuple(warnings))
    return script, result


def _script_text(
    name: str, module: list[Cell], main: list[Cell], is_launch: Callable[[ast.Call], bool]
) -> str:
    """The script: the cells as they are, or with ``main()`` from the first launch on."""
    parts = [f'"""Exported from {name} by `notebook-kit export`."""']
    texts = [f"# %% cell {cell.number}\n{cell.code}" for cell in module]
    if not main:
        parts += texts
    else:
        parts += [_GUARD_FUNCTION, _PREAMBLE, *texts]
        main_texts = [f"# %% cell {cell.number}\n{cell.code}" for cell in main]
        parts += [_main_function(main_texts, is_launch), 'if __name__ == "__main__":\n    main()']
    script = "\n\n\n".join(parts) + "\n"
    try:
        compile(script, name, "exec")
    except SyntaxError as error:
        raise ExportError(
            f"The exported script does not compile ({error.msg}, script line {error.lineno}); "
            "tag the offending cell skip-export."
        ) from error
    return script


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
