"""What the kernel shows of a launch: the observer interface and the displays that implement it.

The launcher talks to a display only through :class:`~notebook_kit.live.observer.LaunchObserver`.
The displays are the notebook view (plain HTML, text and a PNG once the run ends), the headless
text view, the quiet one for ``live=False``, and the run record behind ``last_run()``. What
they show is a list of figures, each a panel (:mod:`notebook_kit.live.panels`): the summary
line, status line, Stop button, progress bar, plot drawn in the browser from only the new
points, speed line, evaluation table and per-rank output.

Runs in the kernel, on the launcher's thread (the Busy keeper listens on a thread of its own).
Only these modules import ipywidgets, anywidget or matplotlib. May import
:mod:`notebook_kit.runtime` (message kinds, the stop flag) and :mod:`notebook_kit.config`;
never :mod:`notebook_kit.launch`.
"""
