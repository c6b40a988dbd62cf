"""Framework integrations: the Hugging Face ``Trainer``, Accelerate and TensorBoard.

- :class:`LiveViewCallback` (``trainer_callback``): a ``TrainerCallback`` feeding the live view.
- :class:`LiveViewTracker` (``accelerate_tracker``): an Accelerate ``GeneralTracker`` that sends
  ``accelerator.log(...)`` of Accelerate's own ``Accelerator`` to the live plot.
- :class:`TensorBoardTracker` (``named_trackers``) and the tracker list of notebook_kit's
  ``Accelerator`` (``trackers``: ``log_with="tensorboard"``).
- ``activation``: what a launch turns on in its processes (a launch hook).

Runs in every training process. Importing this package imports no framework: each name
above imports its framework on first use (``pip install notebook_kit[transformers]``).
May import :mod:`notebook_kit.runtime` and :mod:`notebook_kit.config`.

Example::

    from notebook_kit.integrations import LiveViewCallback
    trainer = Trainer(model, args, train_dataset=data, callbacks=[LiveViewCallback()])
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from notebook_kit.lazy_names import lazy_names

if TYPE_CHECKING:
    from notebook_kit.integrations.accelerate_tracker import LiveViewTracker
    from notebook_kit.integrations.named_trackers import TensorBoardTracker
    from notebook_kit.integrations.trainer_callback import LiveViewCallback

__all__ = ["LiveViewCallback", "LiveViewTracker", "TensorBoardTracker"]

_LAZY = {
    "LiveViewCallback": "trainer_callback",
    "LiveViewTracker": "accelerate_tracker",
    "TensorBoardTracker": "named_trackers",
}

__getattr__, __dir__ = lazy_names(__name__, _LAZY)
