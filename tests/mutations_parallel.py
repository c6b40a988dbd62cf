"""Deliberate breakages of parallelism checks, resumes and weights.

Wired into ``tests.mutations.MUTATIONS``.
"""

from __future__ import annotations

from tests.mutations import Edit, Mutation  # noqa: F401

MUTATIONS: tuple[Mutation, ...] = ()
