"""The notebook view lays out whatever panels the one list holds, and names none of them."""

from __future__ import annotations

import ast
import inspect
from typing import Any

import ipywidgets
import pytest

import notebook_kit.live.notebook_view as notebook_view
from notebook_kit.live import record
from notebook_kit.live.headless import HeadlessObserver
from notebook_kit.live.notebook_view import LiveObserver
from notebook_kit.live.observer import LaunchInfo, LaunchSummary, RankSummary
from notebook_kit.live.panels import Panel
from notebook_kit.live.record import last_run
from notebook_kit.runtime.context import StopFlag
from notebook_kit.runtime.messages import MetricsBatch, Progress

_SUMMARY = LaunchSummary((RankSummary(0, 0, 1.0), RankSummary(1, 0, 1.0)), 1.0)


def test_the_notebook_view_imports_and_names_no_panel() -> None:
    source = inspect.getsource(notebook_view)
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
        elif isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
    names = {node.id for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Name)}
    assert len(record.PANELS) >= 8  # the summary, status, Stop, progress, plot, speed, ...
    for panel in record.PANELS:
        assert panel.__module__ not in imported, panel
        assert panel.__name__ not in names, panel


class _Pings(Panel):
    """A button in the header whose clicks are counted on the kernel's main thread, with a
    block under the plot: the shape of a Stacks or Profile button."""

    name = "pings"
    place = "header"

    def __init__(self) -> None:
        self.clicks = self.seen = 0
        self.button: Any = None
        self.block: Any = None

    def build(self, view: Any) -> list[tuple[str, Any]]:
        self.button = ipywidgets.Button(description="Ping", layout=view.shared.layout)
        self.button.on_click(self._clicked)
        self.block = view.shared.html("", ("nk-pings",))
        return [("header", self.button), ("line", self.block)]

    def _clicked(self, _: Any) -> None:  # on the route's subshell: note the click only
        self.clicks += 1

    @property
    def controls(self) -> list[Any]:  # type: ignore[override]
        return [self.button]

    def draw(self) -> None:
        if self.clicks != self.seen:
            self.seen = self.clicks
            self.block.value = f"pong {self.seen}"

    def summary(self) -> str:
        return f"pings: {self.seen}"

    def output(self) -> dict[str, Any] | None:
        return {"text/plain": f"pong {self.seen}"} if self.seen else None

    def headless(self) -> str:
        return f"[pings] {self.seen}"

    def record(self) -> Any:
        return self.seen


@pytest.fixture(autouse=True)
def _with_pings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(record, "PANELS", (*record.PANELS, _Pings))


def test_a_panel_with_widgets_of_its_own_is_placed_routed_drawn_and_shown_at_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shown: list[dict[str, Any]] = []
    routed: list[tuple[Any, ...]] = []
    monkeypatch.setattr(notebook_view, "display", lambda bundle, **_: shown.append(bundle))
    monkeypatch.setattr(notebook_view, "open_route", lambda claimed, _: routed.append(claimed))
    flag = StopFlag()
    observer = LiveObserver()
    observer.on_start(LaunchInfo("Launching 2 processes", 2, 2, (0, 1), flag))
    pings: _Pings = observer.pings  # type: ignore[assignment]
    assert pings.button in observer.header.children  # beside the Stop button
    children = list(observer.box.children)  # type: ignore[union-attr]
    assert children.index(pings.block) == children.index(observer.plot.widgets[-1]) + 1
    observer.on_metrics(MetricsBatch(0, ((0, 0, {"loss": 1.0}),), 0, Progress(1)))
    observer.on_tick()  # progress: the controls are routed (here, nowhere)
    assert len(routed) == 1 and pings.button in routed[0]
    assert observer.stop.button in routed[0] and observer.plot.controls_widget in routed[0]
    assert "notebook_launcher_async" in observer.stop.note.value  # no route: the hint
    pings.button.click()
    assert pings.block.value == ""  # the handler only noted it
    observer._last_refresh = 0.0
    observer.on_tick()
    assert pings.block.value == "pong 1"  # drawn on the main thread, at the next refresh
    observer.on_finish(_SUMMARY)
    assert shown[1]["text/plain"].splitlines()[1] == "pings: 1"
    assert shown[2]["image/png"].startswith(b"\x89PNG") and shown[3] == {"text/plain": "pong 1"}
    assert pings.button.comm is None and pings.block.comm is None  # closed with the view
    assert last_run().panels["pings"] == 1  # type: ignore[union-attr]
    flag.close()


def test_without_a_notebook_a_panel_builds_nothing_and_prints_its_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    observer = HeadlessObserver()
    observer.on_start(LaunchInfo("Launching 2 processes", 2, 2, (0, 1), StopFlag()))
    observer.on_metrics(MetricsBatch(0, ((0, 0, {"loss": 1.0}),), 0, Progress(1)))
    observer.on_finish(_SUMMARY)
    printed = capsys.readouterr().out.splitlines()
    assert printed[-2].startswith("[finished] step 1 · ") and printed[-1] == "[pings] 0"
    kept = last_run()
    assert kept is not None and kept.panels["pings"] == 0 and kept.figure is None
    assert all(panel.widget is None for panel in observer.recorder.panels)
