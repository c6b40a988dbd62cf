"""notebooks/09_fsdp.ipynb in a real kernel: a GPT-style model trained sharded, then home."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.notebook_text import cell_text, execute_copy
from tests.processes import kernel_environment

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "09_fsdp.ipynb"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.kernel,
    pytest.mark.usefixtures("no_leftover_processes"),
]


def test_the_fsdp_notebook_trains_sharded_with_the_live_view_and_generates_at_home(tmp_path):
    env = kernel_environment()
    env["NOTEBOOK_KIT_CONFIG"] = str(tmp_path / "no-saved-default.json")
    started = time.monotonic()
    nb = execute_copy(NOTEBOOK, tmp_path, env, timeout=240)
    assert time.monotonic() - started < 180
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert not [c for c in code if any(o.output_type == "error" for o in c.outputs)]
    launch = next(cell for cell in code if "notebook_launcher(train" in cell.source)
    kinds = [set(output.get("data", {})) for output in launch.outputs]
    assert any("image/png" in kind for kind in kinds)  # the live view's final plot
    plain = [output.get("data", {}).get("text/plain", "") for output in launch.outputs]
    assert any(text.startswith("Finished in") for text in plain), plain
    shown = "\n".join(cell_text(cell) for cell in code)
    ratios = re.findall(r"rank (\d): \d+ KiB .* \(DDP: \d+ KiB on every rank, ([\d.]+)x\)", shown)
    assert [rank for rank, _ in ratios] == ["0", "1"]
    assert all(float(ratio) <= 0.55 for _, ratio in ratios), ratios
    assert "Parameter True" in shown  # home whole: plain parameters, the tie kept
    generated = re.search(r"'the quick(.*)'", shown)
    assert generated and "fox" in generated.group(1), shown
