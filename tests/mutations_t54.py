"""Deliberate breakages of launches from the clean template process: the way taken and why,
the weights coming home, Stop, the kernel's arguments, nothing left behind, and what cannot
be shipped named first.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

_LAUNCH = "tests/test_template_launch_integration.py::"
_FROM_PG = (
    _LAUNCH
    + "test_a_process_group_in_the_caller_launches_from_the_template_and_brings_weights_home"
)
_KILLED = _LAUNCH + "test_nothing_outlives_a_kernel_killed_during_a_template_launch"
_SAME = _LAUNCH + "test_failures_stop_and_a_dead_template_behave_as_in_a_forked_launch"
_UNSHIPPABLE = _LAUNCH + "test_what_cannot_be_shipped_is_named_before_anything_starts"
_KERNEL = (
    "tests/test_template_kernel_integration.py::"
    "test_a_kernel_holding_a_process_group_launches_from_its_template"
)

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "template-process-group-not-seen",
        "A process group in the kernel sends the launch to the template instead of refusing it",
        (
            Edit(
                "launch/preflight.py",
                '        return "the kernel holds a torch.distributed process group"\n',
                "        pass\n",
            ),
        ),
        (_FROM_PG,),
    ),
    Mutation(
        "template-banner-silent",
        "The banner says the workers start from a clean process, and why",
        (
            Edit(
                "launch/launchers/forked.py",
                'banner += f". {reason[0].upper()}{reason[1:]}: starting workers from a clean '
                'process"',
                "pass",
            ),
        ),
        (_FROM_PG,),
    ),
    Mutation(
        "template-weights-keyed-by-the-templates-models",
        "Rank 0's weights come home into the kernel's models, whose ids differ in the template",
        (
            Edit(
                "launch/template.py",
                "return {self.home_ids[i]: state for i, state in weights.items() "
                "if i in self.home_ids}",
                "return weights",
            ),
        ),
        (_FROM_PG,),
    ),
    Mutation(
        "template-stop-flag-not-shared",
        "Stop reaches ranks forked from the template: the flag's bytes are shared memory",
        (
            Edit(
                "launch/template_wire.py",
                "self._memory = mmap.mmap(fd, 2)",
                "self._memory = mmap.mmap(-1, 2)",
            ),
        ),
        (_SAME,),
    ),
    Mutation(
        "template-workers-see-the-templates-argv",
        "The ranks see the kernel's sys.argv, as forked ranks do",
        (Edit("launch/template_process.py", "    sys.argv[:] = list(request.argv)\n", ""),),
        (_KILLED,),
    ),
    Mutation(
        "template-outlives-its-kernel",
        "The template ends when its kernel's end of the socket closes",
        (
            Edit(
                "launch/template_process.py",
                "                return  # the kernel is gone",
                "                select.select([], [], [], 3600)",
            ),
        ),
        (_KILLED,),
    ),
    Mutation(
        "template-unshippable-not-named",
        "What cannot be shipped is named (closure variable, argument) with the fix",
        (
            Edit(
                "launch/template_shipping.py",
                "    where, culprit, failure = _first_unpicklable(call) or",
                "    where, culprit, failure = None or",
            ),
        ),
        (_UNSHIPPABLE,),
    ),
    Mutation(
        "template-hit-by-the-kernels-interrupt",
        "Ctrl-C in the kernel stops the launch, never the template (its own session, SIGINT off)",
        (
            Edit(
                "launch/template_process.py",
                "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n",
                "",
            ),
            Edit(
                "launch/template_start.py",
                "start_new_session=True,",
                "start_new_session=False,",
            ),
        ),
        (_KERNEL,),
    ),
)
