"""Notebook -> script rules: magics, display-only code, skip-export, main() and its guard."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from notebook_kit.cli.export import ExportError, ExportResult, export_notebook, notebook_to_script
from notebook_kit.cli.main import main as cli_main


def _script(*sources: str, tags: dict[int, list[str]] | None = None) -> str:
    cells = [new_code_cell(source) for source in sources]
    for index, cell_tags in (tags or {}).items():
        cells[index].metadata["tags"] = cell_tags
    return notebook_to_script(new_notebook(cells=[new_markdown_cell("# T"), *cells]))[0]


def test_magics_shell_lines_and_display_only_code_are_dropped():
    script = _script(
        "%matplotlib inline\nimport math\n!pip install nothing\nfiles = !ls\nx = 2\nx",
        "%%bash\necho hi",
        "%%time\ny = math.sqrt(x)",
        "%time z = y + 1",
        "display(z)\nfig.show()\nz\n'literal'\nvalues[0]",
        "print(z)",
    )
    code = script.split('"""', 2)[2]
    assert "import math\nx = 2\n" in code
    for gone in ("matplotlib", "pip", "ls", "echo", "display", "show", "\nx\n", "values"):
        assert gone not in code
    assert "y = math.sqrt(x)" in code and "\nz = y + 1" in code and "print(z)" in code
    namespace: dict = {}
    exec(compile(script, "exported", "exec"), namespace)
    assert namespace["z"] == pytest.approx(2**0.5 + 1)


def test_cells_report_why_they_were_left_out(tmp_path):
    nb = new_notebook(
        cells=[
            new_code_cell("a = 1"),
            new_code_cell("a"),
            new_code_cell("%%html\n<b>x</b>"),
            new_code_cell("b = 2"),
            new_code_cell(""),
        ]
    )
    nb.cells[3].metadata["tags"] = ["skip-export"]
    path = tmp_path / "n.ipynb"
    nbformat.write(nb, path)
    result = export_notebook(path)
    assert result.path == tmp_path / "n.py"
    assert result.kept == (1,)
    assert result.dropped == (
        (2, "display only"),
        (3, "%%html cell magic"),
        (4, "tagged skip-export"),
        (5, "empty"),
    )
    assert "left out cell 2 (display only)" in result.summary()
    assert "No notebook_launcher call" in result.summary()


def test_launch_cells_become_main_with_globals_and_a_local_rank_guard():
    script = _script(
        "from notebook_kit import notebook_launcher\ndef train(n):\n    return n * 2",
        "result = notebook_launcher(train, args=(21,), num_processes=2)",
        "def report():\n    return f'got {result}'\nprint(report())\nresult",
    )
    assert "def main() -> None:\n    global report, result" in script
    launch = script.index("notebook_launcher(train")
    assert launch < script.index("if not _first_process_of_node():\n        return")
    assert script.index("return\n") < script.index("# %% cell 4")
    assert script.rstrip().endswith('if __name__ == "__main__":\n    main()')


@pytest.mark.parametrize(
    ("local_rank", "shown"), [(None, "top\nafter\n"), ("0", "top\nafter\n"), ("1", "")]
)
def test_cells_above_the_launch_print_once_per_node(tmp_path, local_rank, shown):
    """Under torchrun every process runs the top-level cells; only local rank 0 prints them."""
    script = _script(
        "import sys\nnotebook_launcher = lambda f, **_: f()\nprint('top')",
        "notebook_launcher(lambda: print('launched', file=sys.stderr))",
        "print('after')",
    )
    path = tmp_path / "t.py"
    path.write_text(script)
    env = {key: value for key, value in os.environ.items() if key != "LOCAL_RANK"}
    if local_rank is not None:
        env["LOCAL_RANK"] = local_rank
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == (shown, "launched\n")


class _Writes:
    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        self.writes.append("<flush>")


def test_a_script_process_writes_each_printed_line_in_one_piece():
    """print() writes its text and then its end: the ranks of a node share one pipe, so each
    line must reach it in one write, or another rank's line can land inside it."""
    from notebook_kit.cli.script_entry import _ScriptStdout

    stream = _Writes()
    out = _ScriptStdout(stream, once_per_node=False)
    print("between", file=out)
    print("a", "b", sep="-", end="", file=out)
    assert stream.writes == ["between\n", "<flush>"]
    out.flush()
    assert stream.writes[2:] == ["a-b", "<flush>"]


def test_multiline_strings_keep_their_text_inside_main():
    script = _script(
        "from notebook_kit import notebook_launcher",
        'notebook_launcher(print, num_processes=1)\ntext = """a\n  b\n"""\nprint(text)',
    )
    assert '    text = """a\n  b\n"""' in script


def test_awaited_async_launch_becomes_asyncio_run():
    script = _script(
        "from notebook_kit import notebook_launcher_async\nf = print",
        "out = await notebook_launcher_async(f, num_processes=2)",
    )
    assert (
        "    import asyncio\n    out = asyncio.run(notebook_launcher_async(f, num_processes=2))"
        in (script)
    )


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("if True:\n    !ls", "cell 2 line 2: an IPython magic or shell command inside a block"),
        ("x = await something()", "cell 2 line 1: top-level await runs only in a notebook"),
        ("def broken(:\n    pass", "cell 2: invalid syntax"),
    ],
)
def test_cells_that_cannot_run_as_a_script_are_named(source, message):
    with pytest.raises(ExportError, match=message):
        _script(source)


def test_export_command_line(tmp_path, capsys):
    path = tmp_path / "n.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("print('from the script')")]), path)
    assert cli_main(["export", str(path), "-o", str(tmp_path / "t.py")]) == 0
    assert "Wrote" in capsys.readouterr().out
    done = subprocess.run([sys.executable, str(tmp_path / "t.py")], capture_output=True, text=True)
    assert done.stdout == "from the script\n"
    assert cli_main(["export", str(tmp_path / "missing.ipynb")]) == 2
    assert "notebook-kit export: error:" in capsys.readouterr().err


def test_batch_script_options_are_checked_before_anything_is_written(tmp_path, capsys):
    path = tmp_path / "n.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("print('x')")]), path)
    assert cli_main(["export", str(path), "--slurm", "--nodes", "0"]) == 2
    assert "--nodes must be 1 or more, got 0" in capsys.readouterr().err
    assert cli_main(["export", str(path), "--nodes", "4"]) == 2  # sized, but no batch script
    assert "add --coiled-batch or --slurm" in capsys.readouterr().err
    assert not (tmp_path / "n.py").exists()


def test_batch_scripts_ask_for_the_nodes_and_gpus_and_start_one_launcher_per_node(tmp_path):
    path = tmp_path / "n.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("print('x')")]), path)
    options = ["--coiled-batch", "--slurm", "--nodes", "3", "--num-processes", "4", "--gpus"]
    assert cli_main(["export", str(path), "-o", str(tmp_path / "job.py"), *options]) == 0
    coiled = (tmp_path / "job.sh").read_text().splitlines()
    slurm = (tmp_path / "job.sbatch").read_text().splitlines()
    assert {"# COILED ntasks 3", "# COILED gpu true", "# COILED task-on-scheduler true"} <= set(
        coiled
    )
    launch = 'notebook-kit launch --num-processes 4 --master-port 29500 job.py "$@"'
    assert coiled[-1] == f"exec {launch}"
    assert {"#SBATCH --nodes=3", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=4"} <= (
        set(slurm)
    )
    assert slurm[-1] == f"srun {launch}"
    assert os.access(tmp_path / "job.sh", os.X_OK) and os.access(tmp_path / "job.sbatch", os.X_OK)


def _exported(*sources: str) -> tuple[str, ExportResult]:
    cells = [new_code_cell(source) for source in sources]
    return notebook_to_script(new_notebook(cells=[new_markdown_cell("# T"), *cells]))


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("%%distributed -n 2\nx = 1", "cell 3 (`%%distributed -n 2`) runs on a WorkerPool"),
        ("pool = %distributed", "cell 3 (`pool = %distributed`) runs on a WorkerPool"),
        ("pool = WorkerPool(num_processes=2)", "runs on a WorkerPool, whose warm workers live"),
        (
            "cluster = local_cluster(n_workers=2)",
            "cell 3 (`cluster = local_cluster(n_workers=2)`)"
            " makes or joins a cluster; the script runs on every process of every node",
        ),
        ("import ray\nray.init()", "cell 3 (`import ray`) makes or joins a cluster"),
        ("notebook_launcher(f, cluster=client)", "launches on a cluster (cluster=)"),
        (
            "try:\n    notebook_launcher(f)\nexcept WorkerError:\n    pass",
            "cell 3 (`try:`) handles a failed launch (except WorkerError)",
        ),
        ("from notebook_kit.cli.export import export_notebook", "runs notebook-kit's own commands"),
        ("notebook_launcher(f)\nnotebook_kit.last_run()", "launches and reads last_run()"),
    ],
)
def test_what_only_a_kernel_can_run_is_refused_naming_the_cell_and_the_fix(source, message):
    with pytest.raises(ExportError, match=re.escape(message)):
        _exported("from notebook_kit import notebook_launcher\nf = print", source)


def test_kernel_records_and_what_needs_them_are_left_out_with_a_warning():
    script, result = _exported(
        "from notebook_kit import notebook_launcher\nimport notebook_kit",
        "out = notebook_launcher(print)",
        "record = notebook_kit.last_run()\nprint(record)",
        "print(record.metrics)",
        "record = 3\nprint(record)",
        "out, notebook_kit.last_run().stopped",
    )
    assert result.dropped == (
        (4, "needs the kernel, see the warning"),
        (5, "needs the kernel, see the warning"),
        (7, "display only"),
    )
    assert result.warnings == (
        "left out cell 4 (`record = notebook_kit.last_run()`): reads last_run(), the kernel's "
        "record of a launch; a script keeps none.",
        "left out cell 5 (`print(record.metrics)`): uses record, which left-out cell 4 binds.",
    )
    assert "record = 3" in script and "last_run" not in script
    assert "\nwarning: left out cell 5" in result.summary()


def test_a_model_sharded_by_the_last_launch_is_not_used_after_it():
    _, result = _exported(
        "from notebook_kit import FullyShardedDataParallelPlugin, notebook_launcher\nmodel = 1",
        "result = notebook_launcher(train, args=(model,), num_processes=2)",
        "print(result)",
        "print(model)",
    )
    assert result.kept == (2, 3, 4)
    assert result.warnings == (
        "left out cell 5 (`print(model)`): uses model, which the last launch trained with "
        "FSDP: in a script each process holds only its shard; return "
        "accelerator.get_state_dict(model) from the function and load it after the launch.",
    )


def test_temporary_folders_the_cells_make_before_the_last_launch_are_made_once_per_job():
    script, result = _exported(
        "import tempfile\nfrom notebook_kit import notebook_launcher\n"
        "runs = tempfile.mkdtemp(prefix='r-')\ndef f():\n    return tempfile.mkdtemp()",
        "notebook_launcher(f)\nlater = tempfile.mkdtemp()",
    )
    assert "runs = _job_temporary_folder(prefix='r-')" in script
    assert "    return tempfile.mkdtemp()" in script  # each rank's own, as in the kernel
    assert "later = tempfile.mkdtemp()" in script  # after the launch: once per node
    assert result.warnings == (
        "cell 2 (`import tempfile`) line 3: tempfile.mkdtemp() makes one folder for the job "
        "(rank 0 makes it, every process gets its name); on several machines each has its "
        "own folder of that name, so for files every node must read, point TMPDIR at a folder "
        "every node mounts, or use a URL.",
    )
    assert script.index("join_job_group()\n") < script.index("# %% cell 2")


def test_a_config_panel_s_launch_is_a_launch_and_restarts_are_the_launcher_s():
    script, result = _exported(
        "from notebook_kit import ConfigPanel\npanel = ConfigPanel()\nprint('top')",
        "result = panel.launch(print)",
        "print(result)",
        "from notebook_kit import notebook_launcher\nnotebook_launcher(print, max_restarts=1)",
    )
    assert result.has_main and "    result = panel.launch(print)" in script
    assert result.warnings == (
        "cell 5 (`from notebook_kit import notebook_launcher`) line 2: max_restarts= restarts "
        "a notebook launch; under notebook-kit launch a failure ends the job unless you pass "
        "notebook-kit launch --max-restarts K, which runs every process's script again from "
        "its top.",
    )
