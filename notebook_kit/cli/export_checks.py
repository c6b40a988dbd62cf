"""What a notebook does that a script run on every process cannot do as the kernel did.

Cell by cell, what is refused (an :class:`~notebook_kit.cli.export.ExportError` naming the
cell, why, and the fix), warned about, left out with a warning, or carried (a temporary folder
made once for the job), as ``docs/scale_out.md`` lists them. Here too: which calls launch
(:func:`launch_test`), and ``position`` for rewriting a cell's text.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

__all__ = [
    "JOB_FOLDER",
    "Cell",
    "call_name",
    "kernel_only_cells",
    "launch_test",
    "launch_warnings",
    "launches",
    "position",
    "refusal",
    "share_folders_until_the_last_launch",
]

_POOL_MAGIC = re.compile(r"^\s*(?:\w+\s*=\s*)?%%?distributed\b", re.MULTILINE)
_FSDP_WORDS = ("FullyShardedDataParallelPlugin", "fsdp_plugin", "use_fsdp=True", "fully_shard")
_LAUNCHERS = ("notebook_launcher", "notebook_launcher_async")
JOB_FOLDER = "_job_temporary_folder"  # what the script calls for a folder made once per job
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


@dataclass(frozen=True)
class Cell:
    """A kept code cell: its number among all cells, its source and its script code."""

    number: int
    source: str
    code: str

    @property
    def named(self) -> str:
        """``cell 6 (`%%distributed -n 2`)``: the number and first line, as messages say."""
        first = next((line.strip() for line in self.source.splitlines() if line.strip()), "")
        return f"cell {self.number} (`{first[:60]}`)"


def _called(node: ast.AST) -> list[ast.Call]:
    return [inner for inner in ast.walk(node) if isinstance(inner, ast.Call)]


def call_name(call: ast.Call) -> str | None:
    """The called name: ``f`` for ``f(...)`` and ``obj.f(...)``; None for other callees."""
    func = call.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)


def _makes_cluster(call: ast.Call) -> bool:
    """``local_cluster(...)``, ``LocalCluster(...)``, ``SLURMCluster(...)``, ``ray.init(...)``."""
    name = call_name(call) or ""
    if name == "init" and isinstance(call.func, ast.Attribute):
        return getattr(call.func.value, "id", "") == "ray"
    return name == "local_cluster" or name.endswith("Cluster")


def _handles_failed_launch(node: ast.AST, is_launch: Callable[[ast.Call], bool]) -> bool:
    """A ``try`` around a launch whose handler names ``WorkerError``."""
    if not isinstance(node, ast.Try) or not any(
        is_launch(c) for s in node.body for c in _called(s)
    ):
        return False
    caught = [h.type for h in node.handlers if h.type is not None]
    return any(
        getattr(n, "id", getattr(n, "attr", "")) == "WorkerError"
        for t in caught
        for n in ast.walk(t)
    )


def launch_warnings(cell: Cell, is_launch: Callable[[ast.Call], bool]) -> list[str]:
    """What a launch is given that a script's launch does not use: ``max_restarts=``.

    Example:
        >>> code = "notebook_launcher(f, max_restarts=1)"
        >>> launch_warnings(Cell(4, code, code), launch_test([]))[0][:60]
        'cell 4 (`notebook_launcher(f, max_restarts=1)`) line 1: max_'
    """
    calls = [c for c in _called(ast.parse(cell.code)) if is_launch(c)]
    return [
        f"{cell.named} line {call.lineno}: max_restarts= restarts a notebook launch; under "
        "notebook-kit launch a failure ends the job unless you pass notebook-kit launch "
        "--max-restarts K, which runs every process's script again from its top."
        for call in calls
        if any(keyword.arg == "max_restarts" for keyword in call.keywords)
    ]


def refusal(
    number: int, source: str, tree: ast.Module | None, is_launch: Callable[[ast.Call], bool]
) -> str | None:
    """Why cell ``number`` cannot become script code, with the fix; None when it can.

    ``tree`` is the cell's code once its magics are dropped (None when nothing is kept).

    Example:
        >>> refusal(3, "%%distributed\\nx = 1", None, launch_test([]))[:45]
        'cell 3 (`%%distributed`) runs on a WorkerPool'
    """
    cell = Cell(number, source, "").named
    if _POOL_MAGIC.search(source) or (
        tree and any(call_name(c) == "WorkerPool" for c in _called(tree))
    ):
        return (
            f"{cell} runs on a WorkerPool, whose warm workers live in the kernel; a script "
            "has none. Put that code in a function called by notebook_launcher, or tag the "
            "pool's cells skip-export."
        )
    if tree is None:
        return None
    calls = _called(tree)
    if any(_makes_cluster(c) for c in calls):
        return (
            f"{cell} makes or joins a cluster; the script runs on every process of every "
            "node, so each would make its own and train on it. Tag the cluster's cells "
            "skip-export and drop cluster= from the launch: under notebook-kit launch the "
            "batch job's nodes are the cluster."
        )
    if any(is_launch(c) and any(k.arg == "cluster" for k in c.keywords) for c in calls):
        return (
            f"{cell} launches on a cluster (cluster=); under notebook-kit launch the batch "
            "job's nodes run the training. Drop cluster= (and num_nodes=) from the launch."
        )
    if any(_handles_failed_launch(node, is_launch) for node in ast.walk(tree)):
        return (
            f"{cell} handles a failed launch (except WorkerError); under notebook-kit launch "
            "a failing rank ends the job, and restarts come from notebook-kit launch "
            "--max-restarts K, which runs the whole script again. Tag the cells that show "
            "failures skip-export."
        )
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    if any(m.startswith("notebook_kit.cli") for m in imported):
        return (
            f"{cell} runs notebook-kit's own commands; as a script on every process, each "
            "process would start whole jobs of its own. Run this notebook in a kernel "
            "(notebook-kit execute) instead of exporting it."
        )
    return None


def _uses(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _binds(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for statement in tree.body:
        for node in ast.walk(statement):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _sharded_models(
    cells: list[Cell], last: ast.Module, is_launch: Callable[[ast.Call], bool]
) -> set[str]:
    """Names passed to the last launch cell's launches when the notebook trains with FSDP."""
    if not any(word in c.code for c in cells for word in _FSDP_WORDS):
        return set()
    passed: set[str] = set()
    for call in filter(is_launch, _called(last)):
        values = [*call.args[1:], *(k.value for k in call.keywords if k.arg == "args")]
        passed.update(name for value in values for name in _uses(value))
    return passed


def kernel_only_cells(cells: list[Cell], is_launch: Callable[[ast.Call], bool]) -> dict[int, str]:
    """Cell number -> why it is left out, for the cells only a kernel can run (see above).

    Raises:
        ValueError: A launch cell also reads ``last_run()`` (the message names it).

    Example:
        >>> kernel_only_cells([Cell(2, "r = last_run()", "r = last_run()")], launch_test([]))
        {2: "reads last_run(), the kernel's record of a launch; a script keeps none"}
    """
    trees = [ast.parse(cell.code) for cell in cells]
    launching = [i for i, tree in enumerate(trees) if any(is_launch(c) for c in _called(tree))]
    sharded = _sharded_models(cells, trees[launching[-1]], is_launch) if launching else set()
    left: dict[int, str] = {}
    gone: dict[str, int] = {}  # a name only left-out cells bind -> the cell that bound it
    for index, (cell, tree) in enumerate(zip(cells, trees, strict=True)):
        reason = None
        if any(call_name(c) == "last_run" for c in _called(tree)):
            if index in launching:
                raise ValueError(
                    f"{cell.named} launches and reads last_run(), the kernel's record of a "
                    "launch, which a script keeps none of: move last_run() to a cell of its own."
                )
            reason = "reads last_run(), the kernel's record of a launch; a script keeps none"
        elif launching and index > launching[-1] and (used := sorted(_uses(tree) & sharded)):
            reason = (
                f"uses {used[0]}, which the last launch trained with FSDP: in a script each "
                "process holds only its shard; return accelerator.get_state_dict(model) from "
                "the function and load it after the launch"
            )
        elif needed := sorted((_uses(tree) - _binds(tree)) & gone.keys()):
            reason = f"uses {needed[0]}, which left-out cell {gone[needed[0]]} binds"
        if reason is None:
            for name in _binds(tree):
                gone.pop(name, None)
            continue
        left[cell.number] = reason
        gone.update(dict.fromkeys(_binds(tree), cell.number))
    return left


def temporary_folder_calls(tree: ast.Module) -> list[ast.expr]:
    """The callees of ``tempfile.mkdtemp(...)`` calls the cell itself makes (not in a def):
    the kernel makes such a folder once and its workers share it, so the script must too."""
    found: list[ast.expr] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, _SCOPES):
            return
        if isinstance(node, ast.Call) and call_name(node) == "mkdtemp":
            func = node.func
            if isinstance(func, ast.Name) or (
                isinstance(func, ast.Attribute) and getattr(func.value, "id", "") == "tempfile"
            ):
                found.append(func)
        for child in ast.iter_child_nodes(node):
            visit(child)

    for statement in tree.body:
        visit(statement)
    return found


def position(lines: list[str], line: int, column: int) -> int:
    """Character offset in ``"\n".join(lines)`` of an ast position (columns count bytes).

    Example:
        >>> position(["ab", "cd"], 2, 1)
        4
    """
    before = sum(len(text) + 1 for text in lines[: line - 1])
    return before + len(lines[line - 1].encode()[:column].decode(errors="ignore"))


def launch_test(codes: list[str]) -> Callable[[ast.Call], bool]:
    """Whether a call launches: ``notebook_launcher(...)``, ``notebook_launcher_async(...)``,
    or ``panel.launch(...)`` of a ``ConfigPanel`` the notebook made.

    Example:
        >>> is_launch = launch_test(["panel = ConfigPanel()"])
        >>> is_launch(ast.parse("panel.launch(train)").body[0].value)
        True
    """
    panels = {
        target.id
        for code in codes
        for node in ast.walk(ast.parse(code))
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Call)
        and call_name(node.value) == "ConfigPanel"
        for target in node.targets
        if isinstance(target, ast.Name)
    }

    def is_launch(call: ast.Call) -> bool:
        func = call.func
        if call_name(call) in _LAUNCHERS:
            return True
        return (
            isinstance(func, ast.Attribute)
            and func.attr == "launch"
            and (getattr(func.value, "id", None) in panels)
        )

    return is_launch


def launches(node: ast.AST, is_launch: Callable[[ast.Call], bool]) -> bool:
    """Whether ``node`` holds a call that ``is_launch`` (from :func:`launch_test`) accepts.

    Example:
        >>> launches(ast.parse("out = notebook_launcher(train)"), launch_test([]))
        True
    """
    return any(isinstance(inner, ast.Call) and is_launch(inner) for inner in ast.walk(node))


def _share_temporary_folders(cell: Cell, until: int | None = None) -> tuple[Cell, list[str]]:
    """``tempfile.mkdtemp(...)`` made by the cell itself (up to line ``until``) becomes one
    folder for the whole job: a collective, so never where only some processes run."""
    tree = ast.parse(cell.code)
    callees = [c for c in temporary_folder_calls(tree) if until is None or c.lineno <= until]
    lines, code = cell.code.split("\n"), cell.code
    for callee in sorted(callees, key=lambda c: (c.lineno, c.col_offset), reverse=True):
        start = position(lines, callee.lineno, callee.col_offset)
        end = position(lines, callee.end_lineno or callee.lineno, callee.end_col_offset or 0)
        code = code[:start] + JOB_FOLDER + code[end:]
    warnings = [
        f"{cell.named} line {callee.lineno}: tempfile.mkdtemp() makes one folder for the job "
        "(rank 0 makes it, every process gets its name); on several machines each has its "
        "own folder of that name, so for files every node must read, point TMPDIR at a "
        "folder every node mounts, or use a URL."
        for callee in callees
    ]
    return replace(cell, code=code), warnings


def share_folders_until_the_last_launch(
    cells: list[Cell], last: int, is_launch: Callable[[ast.Call], bool]
) -> tuple[list[Cell], list[str]]:
    """The kernel's folders are made once and shared up to the last launch (``cells[last]``,
    up to its last launching statement); after it only some processes run, so not there.

    Example::

        cells, warnings = share_folders_until_the_last_launch(cells, 3, launch_test(codes))
    """
    statements = ast.parse(cells[last].code).body
    until = max(s.end_lineno or s.lineno for s in statements if launches(s, is_launch))
    cells, warnings = list(cells), []
    for index in range(last + 1):
        cells[index], shared = _share_temporary_folders(
            cells[index], until if index == last else None
        )
        warnings += shared
    return cells, warnings
