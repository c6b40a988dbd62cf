"""What the kernel shows of a launch: the observer interface and the displays that implement it.

The launcher talks to a display only through :class:`~notebook_kit.live.observer.LaunchObserver`.
The displays are the notebook view (Stop button, progress bar, per-rank output, plot), the
headless text view, the quiet one for ``live=False``, and the run record behind ``last_run()``.

Runs in the kernel, on the launcher's thread. Only these modules import ipywidgets or
matplotlib. May import :mod:`notebook_kit.runtime` (message kinds, the stop flag) and
:mod:`notebook_kit.config`; never :mod:`notebook_kit.launch`.
"""
