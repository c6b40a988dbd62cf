"""Code ships to the nodes of a real Dask LocalCluster the way users write it.

The function, its arguments and what they refer to come from a notebook cell (``__main__``),
a module of the working folder, a folder added to ``sys.path`` at run time, files sent with
``client.upload_file`` or ``UploadDirectory``, an installed package, or a compiled extension
the nodes lack. Each node is a fresh ``python -m`` process, which has neither the kernel's nor
the Dask worker's ``sys.path``; the probe asks a process started the same way, so its verdict
is the node's.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from notebook_kit import notebook_launcher
from notebook_kit.errors import WorkerError
from notebook_kit.launch.cluster import run as cluster_run
from notebook_kit.launch.cluster.engines.dask import DaskEngine, choose_workers, current_workers
from notebook_kit.launch.cluster.probing import ClusterSetupError
from tests.optional import needs

pytestmark = [pytest.mark.integration, needs("distributed", what="cluster runs")]

_EXTENSION = """
#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "%s", "", -1, methods};
PyMODINIT_FUNC PyInit_%s(void) { return PyModule_Create(&module); }
"""


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0"
        ) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(2)
        yield client


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A folder the kernel adds to ``sys.path`` now, after the cluster started."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [n for n in sys.modules if n.startswith("nk_ship_")]:
        del sys.modules[name]


def _module(folder: Path, name: str, source: str):
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    importlib.invalidate_caches()
    return importlib.import_module(name)


def _launch(client, function, *args):
    return notebook_launcher(
        function, args=args, cluster=client, num_nodes=2, num_processes=1, live=False
    )


def test_code_from_a_cell_the_working_folder_a_run_time_path_and_a_package_runs(client, folder):
    helpers = _module(
        folder,
        "nk_ship_helpers",
        """
        class Scale:
            def __init__(self, factor):
                self.factor = factor
        """,
    )
    training = _module(
        folder,
        "nk_ship_training",
        """
        import nk_ship_helpers
        import torch.distributed as dist

        def train(scale, from_cell, from_folder, from_package):
            assert isinstance(scale, nk_ship_helpers.Scale)
            return (dist.get_world_size() * scale.factor, from_cell(), from_folder(),
                    from_package() > 0)
        """,
    )
    cell: dict = {"__name__": "__main__"}
    exec("def from_cell():\n    return 'cell'\n", cell)  # as a notebook cell defines it
    import psutil

    from tests.test_cluster_checks import _report

    value = _launch(
        client, training.train, helpers.Scale(3), cell["from_cell"], _report, psutil.cpu_count
    )
    assert value[:2] == (6, "cell") and value[3] is True
    assert value[2].worker == "tcp://10.0.0.2:4000"  # a working-folder module, by name


def test_a_module_sent_with_upload_file_runs_on_every_node(client, tmp_path):
    path = tmp_path / "nk_ship_uploaded.py"
    path.write_text(
        "import torch.distributed as dist\n\ndef train():\n    return dist.get_rank()\n"
    )
    client.upload_file(str(path))
    sys.path.insert(0, str(tmp_path))  # the kernel imports it from where it was written
    try:
        uploaded = importlib.import_module("nk_ship_uploaded")
    finally:
        sys.path.remove(str(tmp_path))
    try:
        assert _launch(client, uploaded.train) == 0
    finally:
        del sys.modules["nk_ship_uploaded"]


def test_a_package_sent_with_the_upload_directory_plugin_runs_on_every_node(
    client, tmp_path, monkeypatch
):
    from distributed.diagnostics.plugin import UploadDirectory

    package = tmp_path / "nk_ship_directory"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "steps.py").write_text(
        "import torch.distributed as dist\n\ndef train():\n    return dist.get_world_size()\n"
    )
    monkeypatch.setattr(sys, "path", list(sys.path))  # the plugin adds its folder here too
    client.register_plugin(UploadDirectory(str(package), update_path=True))
    importlib.invalidate_caches()
    try:
        steps = importlib.import_module("nk_ship_directory.steps")
        assert _launch(client, steps.train) == 2
    finally:
        for name in [n for n in sys.modules if n.startswith("nk_ship_directory")]:
            del sys.modules[name]


def _compiled_extension(folder: Path, name: str) -> Path:
    source = folder / f"{name}.c"
    source.write_text(_EXTENSION % (name, name))
    include = sysconfig.get_paths()["include"]
    target = folder / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
    subprocess.run(
        ["cc", "-shared", "-fPIC", f"-I{include}", str(source), "-o", str(target)], check=True
    )
    return target


def _forget_the_file(name: str, dask_worker=None, dask_scheduler=None) -> int:
    """Remove the uploaded files called ``name*`` from this worker's (or the scheduler's)
    folder: a worker keeps the module it imported, a process started now cannot import it.
    The count removed."""
    removed = 0
    for root, _, files in os.walk((dask_worker or dask_scheduler).local_directory):
        for file in files:
            if file.startswith(name):
                os.remove(os.path.join(root, file))
                removed += 1
    return removed


def test_the_probes_verdict_is_the_nodes_outcome_for_a_module_they_cannot_import(
    client, folder, monkeypatch
):
    """A compiled extension cannot be sent by value. Uploaded with ``upload_file``, the Dask
    workers import it; once its file is gone they still hold it, but a node process cannot
    import it. The probe must say what the node does (seen with the probe's check turned off),
    and a refusal names the module and the fix before any rank starts."""
    native = _compiled_extension(folder, "nk_ship_native")
    client.upload_file(str(native))
    client.run(importlib.import_module, "nk_ship_native")  # the workers hold the module
    removed = client.run(_forget_the_file, "nk_ship_native")
    assert all(count >= 1 for count in removed.values()), removed
    client.run_on_scheduler(_forget_the_file, "nk_ship_native")  # its copy, on this machine
    assert all(client.run(lambda: "nk_ship_native" in sys.modules).values())
    uses = _module(
        folder,
        "nk_ship_uses_native",
        "import nk_ship_native\n\ndef train():\n    return nk_ship_native.answer()\n",
    )
    with monkeypatch.context() as unchecked:
        unchecked.setattr(cluster_run, "check_reports", lambda reports, *words: None)
        with pytest.raises(WorkerError) as failed:
            _launch(client, uses.train)
    assert "No module named 'nk_ship_native'" in str(failed.value)

    workers = choose_workers(current_workers(client), 2)
    payload = DaskEngine(client).ship(workers, ((uses.train, (), {}), []))
    verdicts = [r.rebuild_error for r in DaskEngine(client).probe(workers, payload)]
    assert all("No module named 'nk_ship_native'" in str(v) for v in verdicts), verdicts
    with pytest.raises(ClusterSetupError) as refused:
        _launch(client, uses.train)
    message = str(refused.value)
    assert "cannot import module 'nk_ship_native'" in message
    assert "client.upload_file" in message and "Install 'nk_ship_native'" in message


def test_a_module_the_nodes_import_by_name_is_not_sent_by_value(client):
    from notebook_kit.launch.cluster.code_shipping import pickle_recording_modules

    workers = choose_workers(current_workers(client), 2)
    from tests.test_cluster_checks import _report

    payload = DaskEngine(client).ship(workers, ((_report, (), {}), []))
    by_name, _ = pickle_recording_modules(((_report, (), {}), []))
    assert payload == by_name
