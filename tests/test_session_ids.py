"""Identifiers: UUIDv7 text, in the canonical form, sorting by the millisecond they were made in."""

from __future__ import annotations

import uuid

from harness.session.ids import new_id


def test_an_id_is_a_canonical_uuid7_carrying_its_millisecond() -> None:
    for ms in (0, 1, 1_764_000_000_123, 2**48 - 1):
        made = new_id(ms)
        parsed = uuid.UUID(made)
        assert str(parsed) == made
        assert (parsed.version, parsed.variant) == (7, uuid.RFC_4122)
        assert parsed.int >> 80 == ms


def test_ids_sort_by_their_millisecond_and_differ_within_one() -> None:
    made = [new_id(ms) for ms in (5, 5, 6, 1_000, 2**40)]
    assert made[0] != made[1]
    assert sorted(made[1:]) == made[1:]
    assert max(made[:2]) < made[2]
