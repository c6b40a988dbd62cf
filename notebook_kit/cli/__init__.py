"""The ``notebook-kit`` command: config, env, launch (on torchrun), export and execute.

``notebook-kit launch`` hands the processes to torch's own launcher; every process then runs
:mod:`notebook_kit.cli.script_entry`. Runs in a terminal or a batch job, never in a worker.

The top of the import order: may import any subpackage, and none imports it. Kept light:
heavy modules are imported by the subcommand that needs them.
"""

from notebook_kit.cli.main import main

__all__ = ["main"]
