"""Deliberate breakages of the template made at ``import notebook_kit`` and of ``start_method``
as a setting: made in a kernel's own process only, "fork" opting out, adopted by the launch
that needs it, its imports never slowing the workers; the keyword reaching a launch and a
pool, and ``set_start_method()`` above the variable.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

_KERNEL = "tests/test_template_import_kernel_integration.py::"
_AT_IMPORT = _KERNEL + "test_a_kernel_makes_its_template_at_import_and_its_launch_adopts_it"
_OPT_OUT = _KERNEL + "test_start_method_fork_opts_out_and_a_launch_keyword_still_wins"
_SETTING = "tests/test_start_method.py::"
_ELSEWHERE = (
    "tests/test_start_method.py::test_a_script_launch_and_a_cluster_launch_refuse_it_naming_why"
)
_ORDER = _SETTING + "test_keyword_then_config_then_set_start_method_then_variable_then_saved"
_FORK_ASKED = (
    _SETTING + "test_fork_asked_of_a_process_that_cannot_fork_is_refused_for_a_launch_and_a_pool"
)

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "ti59-no-template-at-import",
        "A kernel makes its clean template at import notebook_kit, before the notebook's code",
        (Edit("__init__.py", "    start_at_import(get_start_method)\n", "    pass\n"),),
        (_AT_IMPORT,),
    ),
    Mutation(
        "ti59-template-in-a-fork-of-the-kernel",
        "A process forked from the kernel (a worker among them) is not the kernel: it makes none",
        (
            Edit(
                "launch/template_start.py",
                'return getattr(iopub, "_master_pid", None) == os.getpid()',
                'return getattr(iopub, "_master_pid", None) is not None',
            ),
        ),
        (_AT_IMPORT,),
    ),
    Mutation(
        "ti59-fork-does-not-opt-out",
        "start_method 'fork' (here from the variable) makes no template at import",
        (
            Edit(
                "launch/template_start.py",
                '        if start_method() == "fork":',
                "        if False:",
            ),
        ),
        (_OPT_OUT,),
    ),
    Mutation(
        "ti59-early-template-not-adopted",
        "The launch that needs the template adopts the one made at import, not a second one",
        (
            Edit(
                "launch/template.py",
                "started or take_early_template() or spawn_template()",
                "started or spawn_template()",
            ),
        ),
        (_AT_IMPORT,),
    ),
    Mutation(
        "ti59-workers-inherit-the-imports-low-priority",
        "The template's imports run at a low priority, its forks (and so the workers) do not",
        (
            Edit(
                "launch/template_process.py",
                "os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)",
                "os.setpriority(os.PRIO_PROCESS, os.getpid(), niceness)",
            ),
        ),
        (_AT_IMPORT,),
    ),
    Mutation(
        "ti59-launch-keyword-ignored",
        "A launch's start_method= decides how its workers start, over the process's default",
        (
            Edit(
                "launch/launchers/forked.py",
                'start_route(self.plan.kernel, "notebook_launcher", self.plan.start_method)',
                'start_route(self.plan.kernel, "notebook_launcher", "auto")',
            ),
        ),
        (_FORK_ASKED, _OPT_OUT),
    ),
    Mutation(
        "ti59-set-start-method-under-the-variable",
        "set_start_method() is the process's default above NOTEBOOK_KIT_START_METHOD",
        (
            Edit(
                "launch/launcher.py",
                '        explicit["start_method"] = chosen_start_method()\n',
                "        pass\n",
            ),
        ),
        (_ORDER,),
    ),
    Mutation(
        "ti59-pool-keyword-ignored",
        "A pool's start_method= reaches the check before it starts and the start itself",
        (
            Edit(
                "launch/pool/options.py",
                'start_route(plan.kernel, "WorkerPool", plan.start_method)',
                'start_route(plan.kernel, "WorkerPool")',
            ),
            Edit(
                "launch/pool/workers.py",
                'start_route(None, "WorkerPool", plan.start_method)',
                'start_route(None, "WorkerPool")',
            ),
        ),
        (_FORK_ASKED,),
    ),
    Mutation(
        "start-method-given-to-a-script-ignored",
        "notebook-kit launch refuses a start_method, which torchrun would never use",
        (
            Edit(
                "cli/script_launch.py",
                '    if config.start_method != "auto":',
                "    if False:",
            ),
        ),
        (_ELSEWHERE,),
    ),
    Mutation(
        "start-method-given-to-a-cluster-ignored",
        "A cluster launch refuses a start_method: each node is started clean and forks its ranks",
        (
            Edit(
                "config/schema.py",
                'widget="choice", scope=("cluster",),\n',
                'widget="choice",\n',
            ),
        ),
        (_ELSEWHERE,),
    ),
)
