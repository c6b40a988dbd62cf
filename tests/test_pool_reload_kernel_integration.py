"""An edited module reaches a warm pool's ranks between two cells of a real kernel.

Locally (2 forked ranks): the new function's value on every rank, the same pids, a global
kept, an instance made before with the new method, ``pool.run`` of the kernel's (old) function
object running the new code; a syntax error named with its module, file and line, the old
code kept; ``reload="off"``, ``%%distributed --reload off`` and ``%autoreload 0`` keep the old
code, ``%autoreload 2`` follows the edit.

On a Dask ``LocalCluster`` (2 nodes, 1 rank each) whose nodes import the module from a copy of
their own that never changes, as a remote machine would: only the text the kernel ships can
bring the edit there.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.kernel_cells import real_kernel
from tests.optional import needs
from tests.test_debugger_kernel_integration import _run
from tests.test_pool_reloading import BROKEN, FIRST, SECOND, edit

pytestmark = [pytest.mark.integration, pytest.mark.kernel]

THIRD = SECOND.replace("return 2", "return 3")
SHOW = "(mod.f(), kept, obj.m())"


def _ok(client, code: str, timeout: float = 120.0) -> str:
    cell = _run(client, code, timeout=timeout)
    assert cell.error is None, (cell.error, cell.text)
    return cell.text


def test_an_edited_module_reaches_the_ranks_of_a_local_pool(tmp_path: Path):
    path = tmp_path / "nk_reload_kernel.py"
    path.write_text(FIRST)
    start = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
        "import nk_reload_kernel\n"
        "from notebook_kit import WorkerPool\n"
        "%load_ext notebook_kit\n"
        "pool = WorkerPool(num_processes=2, live=False)\n"
        "pool.run_cell('import nk_reload_kernel as mod\\nkept = 41\\nobj = mod.C()')\n"
        f"pids = pool.pids\nprint('before', pool.run_cell({SHOW!r}, every=True))"
    )
    with real_kernel() as (_, client):
        assert "before {0: (1, 41, 'old'), 1: (1, 41, 'old')}" in _ok(client, start)
        edit(path, SECOND)
        text = _ok(
            client,
            f"print('after', pool.run_cell({SHOW!r}, every=True), pool.pids == pids, "
            "pool.run(nk_reload_kernel.f, ranks='all'))",
        )
        assert "after {0: (2, 41, 'new'), 1: (2, 41, 'new')} True [2, 2]" in text, text
        edit(path, BROKEN)
        refused = _run(client, "pool.run_cell('mod.f()')")
        assert refused.error is not None, refused.text
        said = refused.error["evalue"]
        assert "nk_reload_kernel" in said and f"{path}, line 4" in said, said
        assert "SyntaxError" in said and "keep its old code" in said, said
        kept = _ok(client, "%%distributed --pool pool --reload off\nprint('kept', mod.f())")
        assert "kept 2" in kept, kept
        bad = _run(client, "%%distributed --pool pool --reload sometimes\n1")
        assert "UsageError" in bad.text and "--reload auto" in bad.text, bad.text
        edit(path, THIRD)
        off = "%distributed --pool pool --reload off\n"
        off += "print('off', pool.reload, pool.run_cell('mod.f()'))"
        assert "off off 2" in _ok(client, off)
        follow = "pool.reload = None\n%load_ext autoreload\n%autoreload 0\n"
        assert "zero 2" in _ok(client, follow + "print('zero', pool.run_cell('mod.f()'))")
        text = _ok(
            client, "%autoreload 2\nprint('two', pool.run_cell('mod.f()'), pool.pids == pids)"
        )
        assert "two 3 True" in text, text
        _ok(client, "pool.close()")


@needs("distributed", what="cluster pools")
def test_an_edited_module_is_shipped_to_the_nodes_of_a_cluster_pool(tmp_path: Path):
    from tests.test_cluster_integration import assert_nothing_left, local_cluster

    kernel_copy, node_copy = tmp_path / "kernel", tmp_path / "node"
    for folder in (kernel_copy, node_copy):
        folder.mkdir()
        (folder / "nk_reload_node.py").write_text(FIRST)
    start = (
        f"import sys; sys.path.insert(0, {str(kernel_copy)!r})\n"
        "import nk_reload_node\n"
        "from distributed import Client\n"
        "from notebook_kit import WorkerPool\n"
        "client = Client({address!r})\n"
        "pool = WorkerPool(cluster=client, num_nodes=2, num_processes=1, live=False)\n"
        "pool.run_cell('import nk_reload_node as mod\\nkept = 41\\nobj = mod.C()')\n"
        "pids = pool.pids\n"
        "print('files', set(pool.run_cell('mod.__file__', every=True).values()))\n"
        f"print('before', pool.run_cell({SHOW!r}, every=True))"
    )
    sys.path.insert(0, str(node_copy))  # the Dask workers start with it: their nodes too
    try:
        cluster = local_cluster()
        client_here = cluster.__enter__()
    finally:
        sys.path.remove(str(node_copy))
    try:
        with real_kernel() as (_, client):
            text = _ok(client, start.format(address=client_here.scheduler.address), 240)
            assert f"files {{{str(node_copy / 'nk_reload_node.py')!r}}}" in text, text
            assert "before {0: (1, 41, 'old'), 1: (1, 41, 'old')}" in text, text
            edit(kernel_copy / "nk_reload_node.py", SECOND)  # the nodes' copy stays as it was
            text = _ok(
                client, f"print('after', pool.run_cell({SHOW!r}, every=True), pool.pids == pids)"
            )
            assert "after {0: (2, 41, 'new'), 1: (2, 41, 'new')} True" in text, text
            edit(kernel_copy / "nk_reload_node.py", BROKEN)
            refused = _run(client, "pool.run_cell('mod.f()')")
            assert refused.error is not None, refused.text
            said = refused.error["evalue"]
            assert "nk_reload_node" in said and "line 4" in said and "SyntaxError" in said, said
            kept = _ok(client, "print('kept', pool.run_cell('mod.f()', reload='off'))")
            assert "kept 2" in kept, kept
            _ok(client, "pool.close()")
        assert_nothing_left(client_here)
    finally:
        cluster.__exit__(None, None, None)
