"""Journal data migrations: pure functions over entry payloads, each applied once per database.

Schema migrations (versioned SQL steps) live with each SQL backend; this registry is for the
data inside entries, and runs over every copy of the journal the same way (CE-25 adds the first):
the entries, and the records that hold an entry before it is placed (`COPY_NAMESPACES`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter

from harness.errors import InvalidInput
from harness.messages import parse_json_text
from harness.session import addresses
from harness.session.entries import ENTRY_PAYLOAD_ADAPTER, EntryPayload

PayloadMigration = Callable[[dict[str, Any]], dict[str, Any] | None]

_PENDING_ENTRY = addresses.pending_entry("")
_LANE_REQUEST = addresses.lane_request("")

COPY_NAMESPACES: tuple[str, ...] = (_PENDING_ENTRY.namespace, _LANE_REQUEST.namespace)
"""The record namespaces whose values hold a copy of an entry payload, which a data migration
rewrites with the entries: a pending entry (a queued message, a write made while an operation was
open, a staged tool result), stored by id until it is placed as the entry it holds, and a request
another process posted holding a message for the lane's owner to queue or append. Frames and
checkpoints hold no entry payload; the lane event log refers to entries by id, and only its
`queue_update` events copy what was pending then: a history in the runtime's format, which no
migration here reads."""


@dataclass(frozen=True)
class DataMigration:
    """`migrate` takes one entry payload (a JSON object with its `type`) and returns the new
    payload, or None to leave it unchanged. It must be pure: it may run again on a copy. It sees
    every copy of a payload the journal keeps: each entry's, and each one a record holds before it
    is placed (`apply_to_value`), in the entry's shape."""

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
        payload = self._migrated(stored, f"entry {entry_id}")
        return None if payload is None else ENTRY_PAYLOAD_ADAPTER.dump_json(payload).decode()

    def apply_to_value(self, namespace: str, key: str, value_text: str) -> str | None:
        """The migrated value at (`namespace`, `key`) as JSON text, or None if unchanged or not a
        copy (`COPY_NAMESPACES`). `migrate` sees the entry payload the copy becomes when placed: a
        pending message as a `custom_message` payload for a custom message and a `message` one
        for any other, a pending custom entry as a `custom` payload, and the message of a posted
        request likewise (a request without one, such as a stop, is left alone). A value that
        does not parse is left as it is, as in `apply`; a result that is no longer such a copy (a pending entry turned
        into a compaction, a request's message into custom data) raises `InvalidInput`."""
        if namespace not in COPY_NAMESPACES:
            return None
        try:
            stored = parse_json_text(value_text)
        except ValueError:
            return None
        if not isinstance(stored, dict):
            return None
        where = f"record {namespace}/{key}"
        if namespace == _PENDING_ENTRY.namespace:
            kind = stored.get("type")
            if kind not in ("message", "custom"):
                return None
            # A pending custom entry has its entry's shape already.
            payload = self._migrated(_placed(stored.get("message")) if kind == "message" else stored, where)
            if payload is None:
                return None
            form = ENTRY_PAYLOAD_ADAPTER.dump_python(payload, mode="json")
            if form["type"] in ("message", "custom_message"):
                form = {"type": "message", "message": form["message"]}
            elif form["type"] != "custom":
                raise InvalidInput(f"data migration {self.name} turned {where} into a {form['type']}",
                                   migration=self.name)
            return self._encoded(_PENDING_ENTRY.adapter, form, where)
        if "message" not in stored:
            return None
        payload = self._migrated(_placed(stored["message"]), where)
        if payload is None:
            return None
        form = ENTRY_PAYLOAD_ADAPTER.dump_python(payload, mode="json")
        if form["type"] not in ("message", "custom_message"):
            raise InvalidInput(f"data migration {self.name} turned the message of {where} into a {form['type']}",
                               migration=self.name)
        return self._encoded(_LANE_REQUEST.adapter, {**stored, "message": form["message"]}, where)

    def _migrated(self, stored: Any, where: str) -> EntryPayload | None:
        """`migrate`'s result for the stored payload JSON, validated; None if unchanged."""
        if not isinstance(stored, dict):
            return None
        changed = self.migrate(stored)
        if changed is None:
            return None
        try:
            return ENTRY_PAYLOAD_ADAPTER.validate_python(changed, strict=False)
        except ValueError as error:
            raise InvalidInput(f"data migration {self.name} produced an invalid payload for {where}: {error}",
                               migration=self.name) from error

    def _encoded(self, adapter: TypeAdapter[Any], value: dict[str, Any], where: str) -> str:
        """`value` validated by `adapter` and encoded as the journal writes it."""
        try:
            return adapter.dump_json(adapter.validate_python(value, strict=False)).decode()
        except ValueError as error:
            raise InvalidInput(f"data migration {self.name} produced an invalid value for {where}: {error}",
                               migration=self.name) from error


def _placed(message: Any) -> dict[str, Any]:
    """The entry payload a stored message becomes when it is placed (the runtime's
    `payload_of`): a custom message's is a `custom_message`, any other's a `message`."""
    custom = isinstance(message, dict) and message.get("role") == "custom"
    return {"type": "custom_message" if custom else "message", "message": message}


# Applied in this order on every store that is opened; never reorder or remove an element.
DATA_MIGRATIONS: tuple[DataMigration, ...] = ()
