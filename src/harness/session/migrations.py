"""Journal data migrations: pure functions over entry payloads, each applied once per database.

Schema migrations (versioned SQL steps) live with each SQL backend; this registry is for the
data inside entries, and runs over every copy of the journal the same way (CE-25 adds the first).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.errors import InvalidInput
from harness.messages import parse_json_text
from harness.session.entries import ENTRY_PAYLOAD_ADAPTER

PayloadMigration = Callable[[dict[str, Any]], dict[str, Any] | None]


@dataclass(frozen=True)
class DataMigration:
    """`migrate` takes one entry payload (a JSON object with its `type`) and returns the new
    payload, or None to leave it unchanged. It must be pure: it may run again on a copy."""

    name: str
    migrate: PayloadMigration

    def apply(self, entry_id: str, payload_text: str) -> str | None:
        """The migrated payload of entry `entry_id` as JSON text, or None if unchanged. A stored
        payload that does not parse is left as it is: no reader can read it either (it raises
        `StorageCorruption` where it is read), and a migration that refused it would make every
        command on the store fail, `harness abort` of the run it blocks included. An invalid
        result raises `InvalidInput`, and the migration's transaction rolls back."""
        try:
            stored = parse_json_text(payload_text)
        except ValueError:
            return None
        changed = self.migrate(stored)
        if changed is None:
            return None
        try:
            payload = ENTRY_PAYLOAD_ADAPTER.validate_python(changed, strict=False)
        except ValueError as error:
            raise InvalidInput(f"data migration {self.name} produced an invalid payload: {error}",
                               migration=self.name) from error
        return ENTRY_PAYLOAD_ADAPTER.dump_json(payload).decode()


# Applied in this order on every store that is opened; never reorder or remove an element.
DATA_MIGRATIONS: tuple[DataMigration, ...] = ()
