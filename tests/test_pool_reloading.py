"""Reloading edited modules on a pool's ranks, in this process: which modules, when, how.

The worker side (:class:`PoolReloader`) runs here as it runs before a command on a rank; the
kernel side (:class:`ReloadPolicy`) decides the order a command carries and, for a cluster,
the text it ships. Real kernels and workers: ``tests/test_pool_reload_kernel_integration.py``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from notebook_kit import WorkerPool
from notebook_kit.launch.magic_options import reload_word
from notebook_kit.launch.pool.reloads import ReloadPolicy, check_reload
from notebook_kit.runtime import pool_commands
from notebook_kit.runtime.pool_commands import PoolCell, PoolPull, ReloadOrder, ShippedSource
from notebook_kit.worker.pool.reloading import ModuleReloadError, PoolReloader, is_user_file

FIRST = "def f():\n    return 1\n\nclass C:\n    def m(self):\n        return 'old'\n"
SECOND = "def f():\n    return 2\n\nclass C:\n    def m(self):\n        return 'new'\n"
BROKEN = "def f():\n    return 3\n\ndef g(:\n    pass\n"


def edit(path: Path, text: str) -> None:
    """Write ``text`` and move the mtime on by a second (file systems count in coarse steps)."""
    before = path.stat().st_mtime
    path.write_text(text)
    os.utime(path, (before + 1, before + 1))


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``nk_reload_unit``, a user module in a folder on ``sys.path``, imported."""
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "nk_reload_unit.py"
    path.write_text(FIRST)
    importlib.invalidate_caches()
    importlib.import_module("nk_reload_unit")
    yield path
    sys.modules.pop("nk_reload_unit", None)


def test_an_edited_user_module_is_reloaded_and_old_objects_take_the_new_code(module):
    reloader = PoolReloader()
    mod = sys.modules["nk_reload_unit"]
    old_function, instance = mod.f, mod.C()
    assert reloader.apply(ReloadOrder()) == []  # nothing changed: nothing reloaded
    edit(module, SECOND)
    assert reloader.apply(ReloadOrder()) == ["nk_reload_unit"]
    assert mod.f() == 2 and old_function() == 2  # (a name bound by ``from m import f``)
    assert instance.m() == "new"  # an instance made before gets the new method
    assert reloader.apply(ReloadOrder()) == []  # reloaded once, not at every command


def test_a_module_that_no_longer_compiles_is_named_and_its_old_code_kept(module):
    reloader = PoolReloader()
    mod = sys.modules["nk_reload_unit"]
    edit(module, BROKEN)
    for _ in range(2):  # refused again until the file is fixed, never run on the old code
        with pytest.raises(ModuleReloadError) as refused:
            reloader.apply(ReloadOrder())
        message = str(refused.value)
        assert "'nk_reload_unit'" in message and f"{module}, line 4" in message, message
        assert "SyntaxError" in message and "did not run" in message, message
        assert mod.f() == 1
    edit(module, SECOND)
    assert reloader.apply(ReloadOrder()) == ["nk_reload_unit"] and mod.f() == 2


def test_a_module_that_raises_as_it_runs_again_keeps_its_old_namespace(module):
    reloader = PoolReloader()
    mod = sys.modules["nk_reload_unit"]
    edit(module, FIRST + "raise RuntimeError('not today')\n")
    with pytest.raises(ModuleReloadError, match=r"line 7\).*RuntimeError: not today"):
        reloader.apply(ReloadOrder())
    assert mod.f() == 1 and mod.C().m() == "old"


def test_shipped_text_is_what_a_rank_reloads_whatever_its_own_copy_says(module):
    reloader = PoolReloader()
    mod = sys.modules["nk_reload_unit"]
    shipped = ReloadOrder((ShippedSource("nk_reload_unit", SECOND),))
    assert reloader.apply(shipped) == ["nk_reload_unit"]
    assert mod.f() == 2 and mod.__file__ == str(module)  # its own file still says 1
    assert reloader.apply(ReloadOrder()) == []  # the local copy did not change since
    broken = ReloadOrder((ShippedSource("nk_reload_unit", BROKEN),))
    with pytest.raises(ModuleReloadError, match="line 4"):
        reloader.apply(broken)
    assert mod.f() == 2


def test_only_the_users_own_files_qualify():
    assert not is_user_file(json.__file__)  # the standard library
    assert not is_user_file(pytest.__file__)  # site-packages
    assert not is_user_file(pool_commands.__file__)  # notebook_kit itself
    assert is_user_file("/srv/project/model.py")


def test_the_reload_setting_and_the_magic_option_refuse_other_words():
    assert check_reload("auto") == "auto" and check_reload(None) is None
    with pytest.raises(ValueError, match=r"reload='on'.*'auto'.*'off'"):
        check_reload("on")
    assert reload_word("OFF") == "off"
    with pytest.raises(argparse.ArgumentTypeError, match="--reload auto"):
        reload_word("sometimes")
    with pytest.raises(ValueError, match="reload='yes'"):  # before anything is forked
        WorkerPool(num_processes=2, live=False, reload="yes")


def test_a_command_carries_an_order_only_when_reloading_is_on():
    cell = PoolCell("x", "<cell>", b"")
    assert ReloadPolicy("auto", ship=False).attach(cell).reload == ReloadOrder()
    assert ReloadPolicy("off", ship=False).attach(cell).reload is None
    assert ReloadPolicy("off", ship=False).attach(cell, "auto").reload == ReloadOrder()
    assert ReloadPolicy(None, ship=False).attach(cell).reload == ReloadOrder()  # no autoreload
    assert ReloadPolicy("auto", ship=False).attach(PoolPull("x")) == PoolPull("x")
    with pytest.raises(ValueError, match="reload='never'"):
        ReloadPolicy("never", ship=False)


def test_a_cluster_pool_ships_each_edit_once_and_refuses_a_broken_one(module):
    policy = ReloadPolicy("auto", ship=True)
    cell = PoolCell("x", "<cell>", b"")
    assert policy.attach(cell).reload == ReloadOrder()  # nothing edited since the start
    edit(module, SECOND)
    order = policy.attach(cell).reload
    assert order == ReloadOrder((ShippedSource("nk_reload_unit", SECOND),))
    assert policy.attach(cell).reload == ReloadOrder()  # shipped once
    edit(module, BROKEN)
    for _ in range(2):
        with pytest.raises(ModuleReloadError, match=r"nk_reload_unit.*line 4.*Nothing was sent"):
            policy.attach(cell)


def test_one_broken_module_among_edited_ones_reloads_none_of_them(module):
    other = module.with_name("nk_reload_other.py")
    other.write_text(FIRST)
    importlib.import_module("nk_reload_other")
    try:
        reloader = PoolReloader()
        edit(module, SECOND)  # (reloaded first: imported first)
        edit(other, BROKEN)
        with pytest.raises(ModuleReloadError, match="nk_reload_other"):
            reloader.apply(ReloadOrder())
        assert sys.modules["nk_reload_unit"].f() == 1  # not half the edit: none of it
    finally:
        sys.modules.pop("nk_reload_other", None)
