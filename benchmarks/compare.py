"""Compare notebook_kit with the launchers users would pick instead, on 2 CPU processes.

Run from the repository root::

    .venv/bin/python -m benchmarks.compare            # full run, a few minutes
    .venv/bin/python -m benchmarks.compare --quick    # one repetition each (harness check)

Tools not installed (Accelerate, Lightning: ``pip install '.[bench]'``) get "n/a" rows. The
table, raw values, chart and the tools' own output go to ``benchmarks/results/compare.*``.
"""

from __future__ import annotations

# Repetitions per tool in a full run (interrupts start a fresh caller process each time).
FULL_PLAN = {
    "first": 3,
    "launch": 12,
    "train": 5,
    "memory": 3,
    "failure": 5,
    "interrupt": 3,
    "interrupt-group": 3,
}


def main() -> None:
    # Imported here, not at the top: spawned workers re-import this module as their main
    # and must not pay for the harness (matplotlib) they never use.
    from benchmarks._run import choose, execute, parser
    from benchmarks._tools import TOOLS

    cli = parser(__doc__.splitlines()[0], list(TOOLS))
    arguments = cli.parse_args()
    tools, plan, options = choose(arguments, FULL_PLAN)
    print(execute(tools, plan, options, arguments.out, reference="notebook_kit", stem="compare"))


if __name__ == "__main__":
    main()
