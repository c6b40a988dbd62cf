"""Deliberate breakages of the one message codec: plain data, tuples as declared.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation

_MESSAGES = "tests/test_messages.py::"

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "worker-messages-pickled-whole",
        "a worker's messages reach the kernel as plain data: only a user's value or tensors "
        "are pickled inside them",
        (
            Edit(
                "runtime/codec.py",
                "        if self.kinds.get(kind.__name__) is kind:\n",
                "        if False:\n",
            ),
        ),
        (_MESSAGES + "test_every_kind_decodes_to_what_was_sent_as_plain_data",),
    ),
    Mutation(
        "declared-tuples-come-back-as-lists",
        "what a message's annotations declare as tuples (a batch's records) comes back as tuples",
        (
            Edit(
                "runtime/codec.py",
                "_arrays(hints.get(field.name), tuple))",
                "None)",
            ),
        ),
        (_MESSAGES + "test_every_kind_decodes_to_what_was_sent_as_plain_data",),
    ),
)
