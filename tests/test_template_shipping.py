"""What a launch from the clean template cannot ship is named, with the fix; the start method."""

from __future__ import annotations

import pickle
import sys
import threading

import pytest
from torch import nn

from notebook_kit.launch.template_choice import get_start_method, set_start_method
from notebook_kit.launch.template_shipping import UnshippableError, ship_call

REASON = "the kernel holds a torch.distributed process group"


def _defined_in_a_cell():
    """A function as a notebook cell defines it: cloudpickle sends it by value, globals too."""
    namespace = {"__name__": "__main__", "GUARD": threading.RLock()}
    exec("def uses_the_global():\n    with GUARD:\n        return 1\n", namespace)
    return namespace["uses_the_global"]


def test_a_call_ships_whole_with_its_models_still_the_objects_the_function_reaches():
    model = nn.Linear(2, 1)
    call, models = pickle.loads(ship_call((print, ([model],), {}), [model], REASON))
    assert models[0] is call[1][0][0] and models[0] is not model


@pytest.mark.parametrize(
    ("call", "named"),
    [
        ((print, (), {"file": sys.stderr}), r"keyword argument 'file' \(\w+\).*the file's path"),
        ((_defined_in_a_cell(), (), {}), r"the global 'GUARD' \(RLock\).*Create the lock inside"),
    ],
    ids=["keyword", "global"],
)
def test_what_cannot_be_pickled_is_named_with_the_reason_and_the_fix(call, named):
    with pytest.raises(UnshippableError, match=named) as refused:
        ship_call(call, [], REASON)
    assert str(refused.value).startswith(REASON + ", so the function")


def test_the_start_method_comes_from_the_call_then_the_environment(monkeypatch):
    monkeypatch.setenv("NOTEBOOK_KIT_START_METHOD", "fork")
    assert get_start_method() == "fork"
    monkeypatch.setenv("NOTEBOOK_KIT_START_METHOD", "forkserver")
    with pytest.raises(ValueError, match=r"START_METHOD='forkserver': start_method must be one of"):
        get_start_method()
    set_start_method("auto")
    try:
        assert get_start_method() == "auto"
    finally:
        monkeypatch.setattr("notebook_kit.launch.template_choice._chosen", None)
