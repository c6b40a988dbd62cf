"""Deliberate breakages of the shared pieces the package's shape rests on: attributes delegated
to a part, the command line's usage errors, pickling by value for the kernel, imports on first
use and the trackers' install hint.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "delegated-attribute-reads-its-own-name",
        "A delegated attribute reads the part's field it names (gradient_accumulation_steps is "
        "the gradient state's num_steps), not a field of its own name",
        (
            Edit(
                "accelerator/delegated.py",
                "self.name = self.name or attribute",
                "self.name = attribute",
            ),
        ),
        (
            "tests/test_accelerator.py::"
            "test_settings_precedence_argument_launch_environment_default",
        ),
    ),
    Mutation(
        "cli-usage-error-exits-1",
        "A notebook-kit call with bad input exits with status 2 and says what was wrong",
        (
            Edit(
                "cli/main.py",
                'print(f"notebook-kit {command}: error: {error}", file=sys.stderr)\n    return 2',
                'print(f"notebook-kit {command}: error: {error}", file=sys.stderr)\n    return 1',
            ),
        ),
        ("tests/test_export.py::test_batch_script_options_are_checked_before_anything_is_written",),
    ),
    Mutation(
        "pool-result-pickled-by-reference",
        "A pool call's result whose class was defined on the workers reaches the kernel by value",
        (
            Edit(
                "worker/host_pickling.py",
                "pickler = _HostCloudPickler if by_value else _HostPickler",
                "pickler = _HostPickler",
            ),
        ),
        (
            "tests/test_host_pickling.py::"
            "test_by_value_carries_a_class_defined_on_the_workers_that_the_kernel_cannot_import",
        ),
    ),
    Mutation(
        "lazy-name-imported-from-the-wrong-place",
        "A public name of the package is imported from its own submodule on first use",
        (
            Edit(
                "lazy_names.py",
                'importlib.import_module(f"{package}.{module}")',
                "importlib.import_module(package)",
            ),
        ),
        ("tests/test_import.py",),
    ),
    Mutation(
        "install-hint-names-the-module",
        "A missing tracker package is named as pip installs it (mlflow-skinny, not mlflow)",
        (
            Edit(
                "integrations/named_trackers.py",
                "_, package, extra = PACKAGES[name]",
                "package, _, extra = PACKAGES[name]",
            ),
        ),
        ("tests/test_docstring_examples.py",),
    ),
)
