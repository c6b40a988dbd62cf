"""Deliberate breakages of reloading edited modules on a warm pool's ranks.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

_UNIT = "tests/test_pool_reloading.py::"
_KERNEL = "tests/test_pool_reload_kernel_integration.py::"
_LOCAL = _KERNEL + "test_an_edited_module_reaches_the_ranks_of_a_local_pool"
_CLUSTER = _KERNEL + "test_an_edited_module_is_shipped_to_the_nodes_of_a_cluster_pool"

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "reload-misses-a-newer-mtime",
        "a user module whose file changed since it was loaded is reloaded",
        (
            Edit(
                "worker/pool/reloading.py",
                "mtime is not None and mtime > known:\n",
                "mtime is not None and mtime < known:\n",
            ),
        ),
        (_UNIT + "test_an_edited_user_module_is_reloaded_and_old_objects_take_the_new_code",),
    ),
    Mutation(
        "reload-half-loads-an-edit",
        "every changed file compiles before any is reloaded: a broken one reloads none",
        (
            Edit(
                "worker/pool/reloading.py",
                "            _compile(name, source)\n",
                "            pass\n",
            ),
        ),
        (_UNIT + "test_one_broken_module_among_edited_ones_reloads_none_of_them",),
    ),
    Mutation(
        "reload-leaves-old-instances-old",
        "superreload points old classes and functions at the new code",
        (
            Edit(
                "worker/pool/reloading.py",
                "    superreload(module, importlib.reload, old_objects)\n",
                "    importlib.reload(module)\n",
            ),
        ),
        (_UNIT + "test_an_edited_user_module_is_reloaded_and_old_objects_take_the_new_code",),
    ),
    Mutation(
        "reload-takes-installed-packages",
        "only the user's own files are reloaded, not site-packages or the standard library",
        (
            Edit(
                "worker/pool/reloading.py",
                "    return not real.startswith(_LIBRARIES)\n",
                "    return True\n",
            ),
        ),
        (_UNIT + "test_only_the_users_own_files_qualify",),
    ),
    Mutation(
        "reload-ignores-shipped-text",
        "a cluster rank reloads the module from the text the kernel shipped",
        (
            Edit(
                "worker/pool/reloading.py",
                "    if shipped is None:\n        yield\n        return\n",
                "    if True:\n        yield\n        return\n",
            ),
        ),
        (_UNIT + "test_shipped_text_is_what_a_rank_reloads_whatever_its_own_copy_says",),
    ),
    Mutation(
        "reload-order-not-sent",
        "a cell, call or push carries the reload order when reloading is on",
        (
            Edit(
                "launch/pool/reloads.py",
                "        return dataclasses.replace(command, reload=ReloadOrder(shipped))\n",
                "        return command\n",
            ),
        ),
        (_UNIT + "test_a_command_carries_an_order_only_when_reloading_is_on", _LOCAL),
    ),
    Mutation(
        "reload-order-ignored-by-the-worker",
        "a pool worker reloads before running a command that carries the order",
        (
            Edit(
                "worker/pool/command_loop.py",
                "        if order is not None:\n            self.reloader.apply(order)\n",
                "        if False:\n            self.reloader.apply(order)\n",
            ),
        ),
        (_LOCAL,),
    ),
    Mutation(
        "reload-off-ignored",
        "reload='off' keeps the code the workers loaded",
        (
            Edit(
                "launch/pool/reloads.py",
                '        return mode == "auto"\n',
                "        return True\n",
            ),
        ),
        (_UNIT + "test_a_command_carries_an_order_only_when_reloading_is_on", _LOCAL),
    ),
    Mutation(
        "autoreload-not-followed",
        "with reload unset, %autoreload 0 in the kernel turns the pool's reloading off",
        (
            Edit(
                "launch/pool/reloads.py",
                "            return kernel_autoreload() is not False\n",
                "            return True\n",
            ),
        ),
        (_LOCAL,),
    ),
    Mutation(
        "cluster-pool-ships-nothing",
        "a cluster pool ships the edited text of the kernel's user modules",
        (
            Edit(
                "launch/pool/reloads.py",
                "        shipped = self._ship() if self._shipped is not None else ()\n",
                "        shipped = ()\n",
            ),
        ),
        (_UNIT + "test_a_cluster_pool_ships_each_edit_once_and_refuses_a_broken_one", _CLUSTER),
    ),
    Mutation(
        "magic-reload-option-dropped",
        "%%distributed --reload off runs the cell on the code the workers hold",
        (
            Edit(
                "launch/magic.py",
                "interleave=chosen.interleave, reload=chosen.reload",
                "interleave=chosen.interleave, reload=None",
            ),
        ),
        (_LOCAL,),
    ),
    Mutation(
        "magic-reload-line-ignored",
        "%distributed --pool NAME --reload off sets that pool's reload from then on",
        (
            Edit(
                "launch/magic.py",
                "            self._pool(options).reload = options.reload\n",
                "            self._pool(options)\n",
            ),
        ),
        (_LOCAL,),
    ),
)
