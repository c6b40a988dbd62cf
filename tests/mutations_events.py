"""Deliberate breakages of a cluster's event channel and pool commands.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

_SECURITY = "tests/test_cluster_security_integration.py::"
_CODEC = "tests/test_cluster_codec.py::"
_LAUNCH_ATTACKED = (
    _SECURITY + "test_a_forged_event_during_a_launch_runs_nothing_and_the_launch_returns"
)
_POOL_ATTACKED = _SECURITY + "test_forged_events_and_commands_to_an_idle_pool_run_nothing"

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "event-seal-not-checked",
        "Nothing a third party posts on a run's topics runs in the kernel or on a node: every "
        "frame's seal is checked before anything in it is read",
        (
            Edit(
                "runtime/codec.py",
                "if len(mac) < MAC_BYTES or not hmac.compare_digest(mac, self._mac(data)):",
                "if len(mac) < MAC_BYTES:",
            ),
        ),
        (
            _CODEC + "test_a_frame_sealed_with_another_secret_is_refused_before_it_is_read",
            _LAUNCH_ATTACKED,
            _POOL_ATTACKED,
            "tests/test_ray_integration.py::"
            "test_a_forged_event_through_the_hub_actor_runs_nothing_and_the_launch_returns",
        ),
    ),
    Mutation(
        "event-decode-falls-back-to-pickle",
        "The events between nodes and the kernel carry no pickle: a frame that is not a sealed "
        "message is refused, never unpickled",
        (
            Edit(
                "runtime/codec.py",
                "    message = _unpack(data if seal is None else seal.open(data), kinds)\n",
                "    try:\n"
                "        message = _unpack(data if seal is None else seal.open(data), kinds)\n"
                "    except ProtocolError:\n"
                "        message = __import__('pickle').loads(data)\n",
            ),
        ),
        (_CODEC + "test_a_bare_pickle_is_refused", _LAUNCH_ATTACKED),
    ),
    Mutation(
        "run-secret-through-the-scheduler",
        "A run's secret never crosses the scheduler: it goes from the kernel to each node's "
        "worker directly",
        (
            Edit(
                "launch/cluster/engines/dask.py",
                "            run_node, order, held.key, workers=[worker],",
                "            run_node, order, secret, workers=[worker],",
            ),
            Edit(
                "node/links/dask.py",
                "    secret = get_worker().data[secret_key]\n",
                "    secret = secret_key if isinstance(secret_key, bytes) else b''\n",
            ),
        ),
        (_LAUNCH_ATTACKED,),
    ),
    Mutation(
        "forged-event-ends-the-run",
        "A forged or malformed event is dropped with one warning naming the topic, and the "
        "run goes on",
        (
            Edit(
                "launch/cluster/attempt.py",
                "        except ProtocolError as error:\n            self._forgery(error)\n"
                "            return\n        self.heard[node]",
                "        except ProtocolError as error:\n            self._forgery(error)\n"
                "            raise\n        self.heard[node]",
            ),
        ),
        (_LAUNCH_ATTACKED, _POOL_ATTACKED),
    ),
    Mutation(
        "forged-event-warns-each-time",
        "A run warns once about what was dropped from its topic, however much is posted",
        (
            Edit(
                "launch/cluster/attempt.py",
                "        if self.forged > 1:\n",
                "        if self.forged < 1:\n",
            ),
        ),
        (_LAUNCH_ATTACKED, _POOL_ATTACKED),
    ),
    Mutation(
        "forged-pool-command-relayed",
        "A pool command the kernel did not seal never reaches the node's ranks, and the pool "
        "goes on",
        (
            Edit(
                "node/task.py",
                "        try:\n            self.seal.open(command)\n",
                "        try:\n            pass\n",
            ),
        ),
        (_POOL_ATTACKED,),
    ),
    Mutation(
        "pool-answers-wait-for-the-next-batch",
        "A cluster pool's node sends each answer the moment it has it: twenty trivial calls "
        "take well under a second, not a quarter of a second each",
        (
            Edit(
                "node/protocol.py",
                "    NodeReady, NodeAnswer, NodeFinished, NodeStacks, NodeProfiles,",
                "    NodeReady, NodeFinished, NodeStacks, NodeProfiles,",
            ),
        ),
        (_SECURITY + "test_twenty_calls_on_a_cluster_pool_each_answer_at_once",),
    ),
)
