"""Deliberate breakages of pools started from the clean template process: the way taken and
why, the pipes and the weights file passed as descriptors, the workers' own namespace, Stop,
what cannot be sent named, and "fork" still refusing.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

_SCRIPT = (
    "tests/test_template_pool_integration.py::"
    "test_a_pool_in_a_process_holding_a_process_group_works_from_the_template"
)
_REFUSED = (
    "tests/test_template_pool_integration.py::"
    "test_the_fork_start_method_refuses_a_pool_in_an_unsafe_process_with_the_hint"
)
_KERNEL = "tests/test_template_pool_kernel_integration.py::"
_CELLS = _KERNEL + "test_cells_run_on_warm_workers_started_from_the_template_with_every_option"
_HOME = _KERNEL + "test_a_failing_rank_is_named_and_weights_come_home_into_the_kernels_model"

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "tp59-pool-forks-an-unsafe-kernel",
        "A pool in a kernel holding a process group starts from the template, not refused",
        (
            Edit(
                "launch/preflight.py",
                '    if method == "template" or hazard is not None:\n',
                '    if method == "template":\n',
            ),
        ),
        (_SCRIPT, _CELLS),
    ),
    Mutation(
        "tp59-pool-fork-hint-lost",
        "With 'fork', the refusal says that 'auto' would start the workers from a clean process",
        (
            Edit(
                "launch/preflight.py",
                "        check_fork_safety(state)\n    except ForkSafetyError as error:\n",
                "        check_fork_safety(state)\n    except ZeroDivisionError as error:\n",
            ),
        ),
        (_REFUSED,),
    ),
    Mutation(
        "tp59-pool-start-line-silent",
        "The pool's start line says its workers start from a clean process, and why",
        (
            Edit(
                "launch/pool/workers.py",
                '        return f"{text}. {why}: starting workers from a clean process"',
                "        return text",
            ),
        ),
        (_SCRIPT, _CELLS),
    ),
    Mutation(
        "tp59-pool-pipes-by-number",
        "A pool's command pipes reach the template as descriptors, not as the kernel's numbers",
        (
            Edit(
                "launch/template_shipping.py",
                "        if isinstance(obj, Connection):\n",
                "        if False:\n",
            ),
        ),
        (_SCRIPT,),
    ),
    Mutation(
        "tp59-pool-weights-file-by-the-kernels-number",
        "A template pool's rank 0 writes the weights into the file it was passed",
        (
            Edit(
                "worker/pool/command_loop.py",
                "fd = self.weights_fd  # the same file, as the template passed it",
                "pass",
            ),
        ),
        (_HOME,),
    ),
    Mutation(
        "tp59-pool-namespace-assumed-inherited",
        "Workers from the template hold nothing of the kernel's: what a command needs is sent",
        (
            Edit(
                "launch/pool/workers.py",
                "holdings.forget_all()  # a clean process holds nothing of the kernel's",
                "holdings.remember_all()",
            ),
        ),
        (_SCRIPT,),
    ),
    Mutation(
        "tp59-pool-main-shared-with-the-template",
        "Workers from the template run cells in a __main__ of their own, with the builtins",
        (
            Edit(
                "worker/pool/command_loop.py",
                "    if own_main:  # as a script's",
                "    if False:  # as a script's",
            ),
        ),
        (_SCRIPT,),
    ),
    Mutation(
        "tp59-pool-stop-flag-not-shared",
        "Stop reaches a template pool's ranks through the memory both sides map",
        (
            Edit(
                "launch/template_wire.py",
                "self._memory = mmap.mmap(fd, 2)",
                "self._memory = mmap.mmap(-1, 2)",
            ),
        ),
        (_SCRIPT,),
    ),
    Mutation(
        "tp59-pool-unpicklable-not-named",
        "A value a pool command cannot send is named with its type and the fix",
        (
            Edit(
                "launch/pool/shipping.py",
                "raise UnshippableError(_unpicklable(what, request, error)) from error",
                "raise",
            ),
        ),
        (_SCRIPT,),
    ),
)
