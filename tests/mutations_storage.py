"""Deliberate breakages of checkpoints on object storage.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation  # noqa: F401

MUTATIONS: tuple[Mutation, ...] = ()
