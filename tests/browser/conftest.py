"""Fixtures for end-to-end tests in JupyterLab driven by headless Chromium.

Skipping is explicit: set ``NOTEBOOK_KIT_SKIP_BROWSER=1`` or deselect with ``-m "not browser"``.
Otherwise a missing browser, Playwright or JupyterLab fails the tests with the install command.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import nbformat
import psutil
import pytest

from tests.browser.server import LabServer

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
SKIP_VARIABLE = "NOTEBOOK_KIT_SKIP_BROWSER"
CHROMIUM = os.environ.get("NOTEBOOK_KIT_CHROMIUM", "/usr/bin/chromium")
# Headless on a machine without network or GPU: no sandbox (root), nothing phoned home.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1400, "height": 2000}  # tall: Lab scrolls inside the page, not the window
INSTALL_HINT = (
    "Install them with `apt-get install -y chromium` and "
    "`pip install playwright jupyterlab` (no `playwright install`: the tests drive "
    f"{CHROMIUM}; set NOTEBOOK_KIT_CHROMIUM to use another binary), or skip these tests "
    f'explicitly with {SKIP_VARIABLE}=1 or -m "not browser".'
)
_SCREENSHOTS = pytest.StashKey[list[tuple[str, Path]]]()
_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "browser: drives JupyterLab in headless Chromium (needs chromium, playwright)"
    )
    config.stash[_SCREENSHOTS] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(SKIP_VARIABLE, "") not in ("", "0"):
        reason = f"{SKIP_VARIABLE} is set: browser tests skipped on request"
        for item in items:
            if item.get_closest_marker("browser"):
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    item.stash.setdefault(_REPORTS, {})[report.when] = report
    return report


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    shots = config.stash.get(_SCREENSHOTS, [])
    if shots:
        terminalreporter.section("browser screenshots")
        for test, path in shots:
            terminalreporter.write_line(f"{test}: {path}")


def _missing_tools() -> list[str]:
    missing = [name for name in ("playwright", "jupyterlab") if not importlib.util.find_spec(name)]
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        missing.append(CHROMIUM)
    return missing


def _not_content(folder: str, names: list[str]) -> list[str]:
    """Names not to copy: checkpoints, and sockets or pipes a running kernel may have left."""
    skipped = []
    for name in names:
        path = Path(folder, name)
        if name == ".ipynb_checkpoints" or not (path.is_file() or path.is_dir()):
            skipped.append(name)
    return skipped


@pytest.fixture(scope="package")
def lab_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """JupyterLab on 127.0.0.1 without a token, its root a temporary copy of ``notebooks/``."""
    missing = _missing_tools()
    if missing:
        pytest.fail(f"Browser tests need {', '.join(missing)}. {INSTALL_HINT}", pytrace=False)
    base = tmp_path_factory.mktemp("jupyterlab")
    root = base / "notebooks"
    shutil.copytree(NOTEBOOKS, root, ignore=_not_content)
    server = LabServer(root, base / "state")
    try:
        server.start()
    except RuntimeError as error:
        pytest.fail(str(error), pytrace=False)
    yield server
    killed = server.stop()
    assert not killed, f"processes had to be killed after the tests: {killed}"


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    """Headless Chromium (Debian's build) driven by Playwright.

    Package-scoped: a browser left running spawns helper processes while later tests run.
    """
    if _missing_tools():
        missing = ", ".join(_missing_tools())
        pytest.fail(f"Browser tests need {missing}. {INSTALL_HINT}", pytrace=False)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()
    left = _wait_for_no_browser_processes(10.0)
    for process in left:
        process.kill()
    assert not left, f"browser processes outlived the browser tests: {left}"


def _wait_for_no_browser_processes(timeout: float) -> list[psutil.Process]:
    """Wait until no Chromium or Playwright driver process is left below this one."""
    deadline = time.monotonic() + timeout
    while True:
        left = [
            child
            for child in psutil.Process().children(recursive=True)
            if _is_browser_process(child)
        ]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def _is_browser_process(process: psutil.Process) -> bool:
    try:
        command = " ".join(process.cmdline())
        return process.status() != psutil.STATUS_ZOMBIE and (
            "chrom" in process.name() or "playwright" in command
        )
    except psutil.Error:
        return False


@pytest.fixture
def page(
    request: pytest.FixtureRequest,
    browser: Any,
    lab_server: LabServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Any]:
    """A fresh page; afterwards a screenshot, the visible text on failure, and every kernel
    shut down (the test fails if a kernel or worker process outlives that)."""
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.set_default_timeout(30_000)
    yield page
    _record_page(request, page, tmp_path_factory)
    context.close()
    lab_server.shut_down_kernels()
    left = lab_server.wait_for_no_descendants(10.0)
    for process in left:
        process.kill()
    assert not left, f"kernel or worker processes outlived the test: {left}"


def _record_page(
    request: pytest.FixtureRequest, page: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Save a screenshot of the final page; print the page's text if the test failed."""
    folder = tmp_path_factory.getbasetemp() / "screenshots"
    folder.mkdir(exist_ok=True)
    path = folder / f"{request.node.name}.png"
    try:
        page.screenshot(path=str(path), full_page=True)
    except Exception as error:  # a broken page must not hide the test's own failure
        print(f"screenshot failed: {error!r}")
    else:
        print(f"screenshot: {path}")
        request.config.stash[_SCREENSHOTS].append((request.node.nodeid, path))
    call = request.node.stash.get(_REPORTS, {}).get("call")
    if call is not None and call.failed:
        try:
            text = page.locator("body").inner_text()
        except Exception as error:
            text = f"(page text unavailable: {error!r})"
        print(f"---- visible page text at failure ----\n{text}\n---- end of page text ----")
        call.sections.append(("visible page text at failure", text))  # shown with the failure


@pytest.fixture
def write_notebook(lab_server: LabServer) -> Callable[[str, list[str]], str]:
    """Write a notebook of code cells into the server's root; returns its path there."""

    def write(name: str, cells: list[str]) -> str:
        notebook = nbformat.v4.new_notebook()
        notebook.metadata["kernelspec"] = {
            "name": "python3",
            "display_name": "Python 3",
            "language": "python",
        }
        notebook.cells = [nbformat.v4.new_code_cell(source) for source in cells]
        nbformat.write(notebook, lab_server.root / name)
        return name

    return write
