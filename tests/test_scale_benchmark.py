"""``benchmarks.scale``: its machinery at a tiny size (2 nodes x 2 simulated ranks on a Dask
scheduler and one process of two workers), and its refusals of bad input. Timings are never
asserted (the machine may be busy): what is checked is that each figure is real."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # benchmarks/ is a folder of the repository, not installed
    sys.path.append(str(ROOT))  # after the package's own folder (tests.bite's broken copy)

from benchmarks import scale  # noqa: E402
from benchmarks._scale_run import Rates, ScaleResult, measure_size  # noqa: E402

# Short bounds: a breakage that keeps Stop or the failure from arriving ends the run with a
# note within seconds, well inside the per-test timeout.
_RATES = Rates(seconds=1.0, fail_after=1.0, start_timeout=45.0, patience=10.0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScaleResult]:
    """One size, 4 ranks on 2 nodes, measured once for the module."""
    from benchmarks._scale_cluster import DaskScale

    cluster = DaskScale(2, 2, tmp_path_factory.mktemp("scale"))
    try:
        yield measure_size(cluster.cluster, cluster.scheduler_processes(), 4, 2, _RATES)
    finally:
        cluster.close()


@pytest.mark.integration
def test_points_lines_stop_and_the_failure_are_all_measured_at_a_tiny_size(
    tiny: ScaleResult,
) -> None:
    line = check_tiny_run(tiny)
    assert " · newest point " in line and " · stop " in line


def check_tiny_run(tiny: ScaleResult) -> str:
    """Every figure of a 2 nodes x 2 ranks run is real, on any engine; its last line."""
    assert tiny.notes == []
    # Every simulated rank's points reached the kernel's plot feed, and its lines the output.
    assert tiny.ranks_seen == 4
    assert tiny.lines_seen >= 4
    assert tiny.newest_point_median > 0.0
    # Stop reached every rank of both nodes, through the engine and each node's relay.
    assert tiny.ranks_stopped == 4
    assert tiny.stop is not None and tiny.stop >= 0.0
    # The kernel's error named the rank that raised (the last one, on node 1).
    assert tiny.failed_rank_named == 3
    assert tiny.failure_named is not None and tiny.failure_named >= 0.0
    # CPU is counted in clock ticks: at this size a window can hold none of the kernel's.
    assert tiny.kernel_cpu >= 0.0 and tiny.scheduler_cpu >= 0.0
    line = scale.last_line(tiny)
    assert line.startswith("scale 4 ranks: kernel cpu ") and "never" not in line
    return line


def test_cpu_counts_the_named_process_and_reads_zero_once_it_is_gone() -> None:
    from benchmarks._scale_run import _cpu

    own = psutil.Process()
    before = _cpu(own)
    started = time.process_time()
    while time.process_time() - started < 0.2:
        pass
    assert _cpu(own) - before >= 0.1
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    watched = psutil.Process(child.pid)
    child.wait()
    assert _cpu(watched) == 0.0


def test_a_stop_that_did_not_reach_every_rank_reads_never() -> None:
    result = ScaleResult(512, 64, ranks_stopped=500, failed_rank_named=511, failure_named=0.4)
    line = scale.last_line(result)
    assert " · stop never · failure named 0.40 s · " in line
    assert "stop NOT met" in scale._verdicts(result)


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["--ranks", "0"], "--ranks"),
        (["--ranks", "8", "-8"], "--ranks"),
        (["--ranks", "12", "--ranks-per-node", "8"], "--ranks 12"),
        (["--ranks-per-node", "0"], "--ranks-per-node"),
        (["--metrics-per-second", "0"], "--metrics-per-second"),
        (["--lines-per-second", "-1"], "--lines-per-second"),
        (["--seconds", "0"], "--seconds"),
        (["--nodes-per-process", "99"], "--nodes-per-process"),
        (["--ranks", "8000000"], "--ranks 8000000 needs 1000000 simulated nodes"),
        (["--engine", "ray", "--ranks", "8000000"], "and a Ray worker process for each"),
    ],
)
def test_bad_input_is_refused_naming_the_option_before_anything_starts(
    argv: list[str], option: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def started(arguments: object) -> None:
        raise AssertionError("the benchmark started despite bad input")

    monkeypatch.setattr(scale, "run", started)
    problem = scale.check_arguments(scale.parser().parse_args(argv))
    assert option in problem
    with pytest.raises(SystemExit) as ended:
        scale.main(argv)
    assert ended.value.code == 2


def test_on_ray_a_size_dask_holds_is_refused_when_its_worker_processes_would_not_fit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With 10 GiB free, 64 nodes fit as 8 processes of Dask workers (9.4 GiB) but not as 64
    Ray worker processes beside Ray's own (15.6 GiB): the refusal names the option and the
    largest size that fits."""

    class Free:
        available = 10 << 30

    monkeypatch.setattr(scale.psutil, "virtual_memory", lambda: Free())
    assert scale.check_arguments(scale.parser().parse_args(["--ranks", "512"])) == ""
    problem = scale.check_arguments(
        scale.parser().parse_args(["--engine", "ray", "--ranks", "512"])
    )
    assert problem.startswith("--ranks 512 needs 64 simulated nodes and a Ray worker process")
    assert "pass --ranks up to about 304" in problem
