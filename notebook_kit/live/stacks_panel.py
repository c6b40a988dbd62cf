"""The Stacks button: every rank's stacks, asked from the view, shown under the plot.

A click asks the run for its ranks' stacks at the next refresh (the future ``ask_stacks``
returns, :mod:`notebook_kit.live.ask_button`), and a later refresh shows them in a block of
fixed height under the plot. The last answer stays in the saved notebook as plain text under
the summary, and in ``last_run().panels["stacks"]``.
"""

from __future__ import annotations

import html
import time
from typing import Any

from notebook_kit.live.ask_button import AskButtonPanel, asker

__all__ = ["StacksPanel"]

ASK_SECONDS = 2.0  # the ranks' time to answer: a blocked rank answers from a thread of its own


class StacksPanel(AskButtonPanel):
    """A Stacks button beside Stop; every rank's stacks in a block under the plot."""

    name = "stacks"
    button_text = "Stacks"
    icon = "align-left"
    tooltip = "Every rank's stack now, shown under the plot (the run goes on)"
    block_style = "white-space:pre"

    def __init__(self) -> None:
        super().__init__()
        self.texts: dict[int, str] | None = None  # the last answer, rank by rank
        self.note: str | None = None  # what the answer leaves out (py-spy's frames)
        self.asked_at = ""  # the wall time of the last answer's question

    def ask(self) -> Any:
        ask = asker("stacks")
        if ask is None:
            self._say("This run cannot be asked for its stacks.")
            return None
        self.asked_at = time.strftime("%H:%M:%S")
        try:
            future = ask(timeout=ASK_SECONDS)
        except RuntimeError as error:  # the run ended just now
            self._say(str(error))
            return None
        self._say(f"Asking every rank for its stacks ({self.asked_at})…")
        return future

    def answered(self, future: Any) -> None:
        try:
            answer = future.result()
        except Exception as error:  # the run ended while the ranks were asked
            self._say(f"No stacks: {error}")
            return
        self.texts, self.note = dict(answer), getattr(answer, "note", None)
        self._say(self._text())

    def _text(self) -> str:
        parts = [f"Stacks at {self.asked_at}", *(self.texts or {}).values()]
        return "\n\n".join([*parts, *([self.note] if self.note else [])])

    def _say(self, text: str) -> None:
        self.show(html.escape(text))

    def output(self) -> dict[str, Any] | None:
        """The last stacks taken, as plain text under the summary of the saved notebook."""
        return {"text/plain": self._text()} if self.texts is not None else None

    def record(self) -> Any:
        """``{rank: text}`` of the last stacks taken from the view, None if none were."""
        return self.texts
