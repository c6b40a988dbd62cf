"""Deliberate breakages of exported scripts.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation  # noqa: F401

MUTATIONS: tuple[Mutation, ...] = ()
