"""Deliberate breakages of exported scripts (wired into ``tests.mutations.MUTATIONS``)."""

from __future__ import annotations

from tests.mutations import Edit, Mutation  # noqa: F401

MUTATIONS: tuple[Mutation, ...] = ()
