"""The package tree is the architecture: imports between subpackages run one way only, and no
two files import each other, even round a longer circle.

Every ``import`` statement in the package is read (including ones inside functions and under
``TYPE_CHECKING``), so a shortcut taken anywhere shows up here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import notebook_kit

PACKAGE = Path(notebook_kit.__file__).parent

# What each part may import, besides itself. The root modules ``errors``, ``atomic_file`` and
# ``lazy_names`` (the packages' imports on first use) are leaves every part may use; the root
# ``__init__`` and ``__main__`` are the public face.
LEAVES = {"errors", "atomic_file", "lazy_names"}
ALLOWED: dict[str, set[str]] = {
    "leaf": set(),
    "config": set(),
    "runtime": {"config"},
    "integrations": {"runtime", "config"},
    "accelerator": {"integrations", "runtime", "config"},
    "worker": {"runtime", "config"},
    "live": {"runtime", "config"},
    "node": {"runtime", "config"},
    "launch": {"node", "worker", "live", "accelerator", "integrations", "runtime", "config"},
    "cli": {"launch", "worker", "live", "accelerator", "integrations", "runtime", "config"},
}


def _part(module: str) -> str:
    """The part of the package a dotted module name belongs to."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in {"__init__", "__main__"}:
        return "root"
    return "leaf" if parts[1] in LEAVES else parts[1]


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported notebook_kit module) for every import statement in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [
                (node.lineno, a.name) for a in node.names if a.name.startswith("notebook_kit")
            ]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("notebook_kit"):
            module = node.module or ""
            if module == "notebook_kit":  # ``from notebook_kit import x``: x may be a module
                found += [(node.lineno, f"notebook_kit.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, module))
    return found


def _modules() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py") if "__pycache__" not in path.parts)


def test_every_module_belongs_to_a_known_part() -> None:
    for path in _modules():
        relative = path.relative_to(PACKAGE)
        name = relative.parts[0].removesuffix(".py")
        assert name in {
            *ALLOWED,
            *LEAVES,
            "__init__",
            "__main__",
        }, relative


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_run_one_way(path: Path) -> None:
    module = ".".join(("notebook_kit", *path.relative_to(PACKAGE).with_suffix("").parts))
    source = _part(module.removesuffix(".__init__"))
    if source == "root":
        return  # the public face may import anything
    wrong = [
        f"line {line}: {source} imports {target}"
        for line, target in _imports(path)
        if (part := _part(target)) != source and part not in ALLOWED[source] | {"leaf"}
    ]
    assert not wrong, f"{path.relative_to(PACKAGE)} imports upward: {wrong}"


def test_each_subpackage_says_what_it_holds_and_may_import() -> None:
    for name in ALLOWED.keys() - {"leaf"}:
        docstring = ast.get_docstring(ast.parse((PACKAGE / name / "__init__.py").read_text()))
        assert docstring and "import" in docstring.lower(), (
            f"{name}/__init__.py lacks its docstring"
        )


def test_modules_sharing_a_name_say_which_side_they_are() -> None:
    """Two ``metrics.py`` read as one thing unless each first line says its side and place."""
    by_name: dict[str, list[Path]] = {}
    for path in _modules():
        if path.name not in {"__init__.py", "__main__.py"}:
            by_name.setdefault(path.name, []).append(path)
    unclear = []
    for paths in (paths for paths in by_name.values() if len(paths) > 1):
        for path in paths:
            first = (ast.get_docstring(ast.parse(path.read_text())) or "").split("\n")[0]
            side = first.startswith(("Kernel side", "Worker side")) and " run in " in first
            if not side:
                unclear.append(f"{path.relative_to(PACKAGE)}: {first!r}")
    assert not unclear, (
        f"first docstring line must say 'Kernel/Worker side ..., run in ...': {unclear}"
    )


def _module_name(path: Path) -> str:
    parts = ("notebook_kit", *path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _file_imports() -> dict[str, set[str]]:
    """Each module -> the package's modules its import statements name (``from a import b``
    names the module ``a.b`` when there is one, else ``a``)."""
    paths = {_module_name(path): path for path in _modules()}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        named: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                named |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                named |= {
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in paths else node.module
                    for a in node.names
                }
        graph[name] = {target for target in named if target in paths and target != name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other round a circle (Tarjan's strongly
    connected components, those of more than one module)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for target in graph[module]:
            if target not in order:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], order[target])
        if low[module] == order[module]:
            group = stack[stack.index(module) :]
            del stack[stack.index(module) :]
            if len(group) > 1:
                circles.append(sorted(group))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return circles


def test_no_import_circle_between_files() -> None:
    """A circle makes the import order matter and the files one unit; every statement counts,
    in functions and under TYPE_CHECKING too, so a deferred import does not hide one."""
    circles = _circles(_file_imports())
    assert not circles, f"modules importing each other: {circles}"


# The one module under ``node/`` that imports torch: it runs only in a zygote's child, as a node
# process does, and reaches it by name (the zygote's target), never by an import.
_NODE_TORCH = "notebook_kit.node.probe_child"


def _torch_imports(path: Path) -> list[int]:
    """Lines of ``path`` that import torch, in functions too."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            lines += [node.lineno for a in node.names if a.name.split(".")[0] == "torch"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            lines.append(node.lineno)
    return lines


def test_an_engine_worker_never_imports_torch() -> None:
    """``node/`` runs in a long-lived Dask or Ray worker, where torch costs seconds and hundreds
    of MiB and may touch the CUDA driver; what needs torch asks a zygote's child."""
    graph = _file_imports()
    node = {_module_name(path): path for path in _modules() if _part(_module_name(path)) == "node"}
    wrong = [
        f"{name} line {line}"
        for name, path in node.items()
        if name != _NODE_TORCH
        for line in _torch_imports(path)
    ]
    assert not wrong, f"node/ imports torch: {wrong}"
    importers = sorted(name for name, targets in graph.items() if _NODE_TORCH in targets)
    assert not importers, f"{_NODE_TORCH} runs in a zygote's child only; imported by {importers}"
