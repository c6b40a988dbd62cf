"""``cluster="ray"`` before anything starts: the handles, and what a missing ray says.

No Ray runtime here: these run whether ray is installed or not (``ray`` is hidden where the
test needs it missing). The runs themselves are tests/test_ray_integration.py.
"""

from __future__ import annotations

import sys

import pytest

from notebook_kit import WorkerPool, notebook_launcher
from notebook_kit.launch.cluster.ray_engine import _renamed
from tests.optional import needs


def _train():
    return 1


@pytest.mark.parametrize("handle", ["ray", "ray://head:10001"])
def test_without_ray_cluster_ray_says_how_to_install_it_before_anything_starts(monkeypatch, handle):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'notebook_kit\[ray\]'") as caught:
        notebook_launcher(_train, cluster=handle, num_nodes=2, num_processes=1, live=False)
    assert f"cluster={handle!r} runs the launch on a Ray cluster" in str(caught.value)
    with pytest.raises(ImportError, match=r"pip install 'notebook_kit\[ray\]'"):
        WorkerPool(cluster=handle, num_nodes=2, num_processes=1, live=False)


def test_another_string_is_refused_naming_the_handles():
    with pytest.raises(ValueError, match=r"cluster='dask' is not a cluster: .*'ray'.*'ray://"):
        notebook_launcher(_train, cluster="dask", num_nodes=2, live=False)


@needs("ray", what="the Ray handle's check")
def test_cluster_ray_without_ray_init_says_to_join_a_cluster_first():
    import ray

    if ray.is_initialized():
        pytest.skip("a Ray runtime of another test module is up in this process")
    with pytest.raises(ValueError, match=r"ray\.init\(address='auto'\).*ray://head:10001"):
        notebook_launcher(_train, cluster="ray", num_nodes=2, live=False)
    assert not ray.is_initialized()  # nothing was started on the user's behalf


def test_a_place_whose_process_died_is_renamed():
    assert not _renamed("10.0.0.2/ab12cd34#1")
    assert _renamed("10.0.0.2/ab12cd34#1.2")
