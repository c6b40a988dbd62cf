"""Deliberate breakages of the live view, the speed line and the warm-up.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation  # noqa: F401

MUTATIONS: tuple[Mutation, ...] = ()
