"""Running cells in a real kernel through a jupyter_client, as a front end does."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

Message = dict[str, Any]


def cell_messages(
    client: Any,
    msg_id: str,
    timeout: float,
    on_message: Callable[[Message], None] | None = None,
) -> list[Message]:
    """The iopub messages of the request ``msg_id`` until the kernel is idle after it;
    ``on_message`` sees each one as it arrives."""
    messages, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = client.get_iopub_msg(timeout=max(deadline - time.monotonic(), 0.01))
        if message["parent_header"].get("msg_id") != msg_id:
            continue
        messages.append(message)
        if on_message is not None:
            on_message(message)
        if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
            return messages
    raise AssertionError(f"the cell did not finish within {timeout:g} s (request {msg_id})")


def run_cell(client: Any, code: str, timeout: float = 60.0) -> list[Message]:
    """Execute ``code`` and return its iopub messages once the kernel is idle again."""
    return cell_messages(client, client.execute(code), timeout)
