"""Typed addresses of the records kept beside the entries, and the built-in ones the harness uses.

A `ValueAddress[T]` names one replaceable value, a `ListAddress[T]` one append-only list; both
carry the pydantic adapter that encodes and decodes `T`. Applications make their own with
`value_address` and `list_address` outside the reserved `harness.` namespaces.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import JsonValue, TypeAdapter

from harness.messages import CleanJson, CleanJsonObject, CleanStr
from harness.session.records import (
    LaneConfig,
    LaneLastResult,
    LaneRequest,
    LaneState,
    OperationMeta,
    OperationState,
    PendingEntry,
)

T = TypeVar("T")

RESERVED_PREFIX = "harness."

_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}


def _adapter(tp: Any) -> TypeAdapter[Any]:
    if tp not in _ADAPTERS:
        _ADAPTERS[tp] = TypeAdapter(tp)
    return _ADAPTERS[tp]


@dataclass(frozen=True)
class ValueAddress(Generic[T]):
    """One replaceable value: `(namespace, key)` and the adapter of its type."""

    namespace: str
    key: str
    adapter: TypeAdapter[T] = field(compare=False, repr=False)

    @property
    def reserved(self) -> bool:
        return self.namespace.startswith(RESERVED_PREFIX)


@dataclass(frozen=True)
class ListAddress(Generic[T]):
    """One append-only list, ordered by commit seq: `(namespace, key)` and the item adapter."""

    namespace: str
    key: str
    adapter: TypeAdapter[T] = field(compare=False, repr=False)


# The built-in addresses' adapters, resolved once: looking a type up in `_ADAPTERS` hashes it,
# and hashing an annotated union such as `OperationState` walks all of its members.
_TIP = _adapter(str | None)
_LANE_CONFIG = _adapter(LaneConfig)
_LANE_STATE = _adapter(LaneState)
_LAST_RESULT = _adapter(LaneLastResult)
_LANE_REQUEST = _adapter(LaneRequest)
_OPERATION_META = _adapter(OperationMeta)
_OPERATION_STATE = _adapter(OperationState)
_PENDING_ENTRY = _adapter(PendingEntry)
_JSON_OBJECT = _adapter(CleanJsonObject)
_JSON = _adapter(CleanJson)
_TEXT = _adapter(CleanStr)


def _check_part(name: str, part: str) -> None:
    if "\x00" in part:
        raise ValueError(f"address {name} must not contain NUL")


def value_address(namespace: str, key: str = "", tp: Any = CleanJson) -> ValueAddress[Any]:
    """An application value address; `tp` is any pydantic-compatible type (default: JSON)."""
    _check_part("namespace", namespace)
    _check_part("key", key)
    if not namespace:
        raise ValueError("address namespace must not be empty")
    return ValueAddress(namespace, key, _adapter(tp))


def list_address(namespace: str, key: str = "", tp: Any = CleanJson) -> ListAddress[Any]:
    """An application list address; `tp` is the type of one item."""
    _check_part("namespace", namespace)
    _check_part("key", key)
    if not namespace:
        raise ValueError("address namespace must not be empty")
    return ListAddress(namespace, key, _adapter(tp))


def branch_tip(lane: str) -> ValueAddress[str | None]:
    """The entry a lane continues from; None for a lane on an empty branch."""
    return ValueAddress("harness.branch.tip", lane, _TIP)


BRANCH_TIP_NAMESPACE = "harness.branch.tip"


def lane_config(lane: str) -> ValueAddress[LaneConfig]:
    return ValueAddress("harness.lane.config", lane, _LANE_CONFIG)


def lane_state(lane: str) -> ValueAddress[LaneState]:
    return ValueAddress("harness.lane.state", lane, _LANE_STATE)


def lane_last_result(lane: str) -> ValueAddress[LaneLastResult]:
    return ValueAddress("harness.lane.last_result", lane, _LAST_RESULT)


def lane_request(request_id: str) -> ValueAddress[LaneRequest]:
    """A request another process posted for a lane's owner (`Session.post_request`), until the
    owner takes it, in commit order; the request names its lane."""
    return ValueAddress(LANE_REQUEST_NAMESPACE, request_id, _LANE_REQUEST)


LANE_REQUEST_NAMESPACE = "harness.lane.request"


def operation_meta(operation_id: str) -> ValueAddress[OperationMeta]:
    return ValueAddress("harness.op.meta", operation_id, _OPERATION_META)


def operation_state(operation_id: str) -> ValueAddress[OperationState]:
    return ValueAddress("harness.op.state", operation_id, _OPERATION_STATE)


def pending_entry(entry_id: str) -> ValueAddress[PendingEntry]:
    """A queued message or custom entry, stored by its pre-minted entry id until placed."""
    return ValueAddress("harness.pending.entry", entry_id, _PENDING_ENTRY)


def tool_args(operation_id: str, turn_id: str, source_index: int) -> ValueAddress[dict[str, JsonValue]]:
    """The effective arguments of one tool call, written at its intent (HA-8, HA-11)."""
    return ValueAddress("harness.op.tool_args", f"{operation_id}:{turn_id}:{source_index}",
                        _JSON_OBJECT)


def tool_checkpoint(operation_id: str, invocation_id: str) -> ValueAddress[JsonValue]:
    """A running tool's persisted partial result."""
    return ValueAddress("harness.pending.tool_output", f"{operation_id}:{invocation_id}", _JSON)


def assistant_frames(operation_id: str, response_entry_id: str) -> ListAddress[dict[str, JsonValue]]:
    """Persisted pages of a streaming assistant reply, so a restart shows what was seen. Each page
    is `{"frames": [...]}`, stream frames in the JSON of `harness.providers.protocol.StreamFrame`; the
    runtime owns their meaning (this layer does not import providers)."""
    return ListAddress("harness.pending.assistant_frame", f"{operation_id}:{response_entry_id}",
                       _JSON_OBJECT)


LANE_EVENTS_NAMESPACE = "harness.lane.events"
"""A lane's event log, keyed by lane name: one item per commit holding that commit's durable
events of the lane, each with a seq of its own (the item's `span`); the runtime owns the items'
meaning (`harness.runtime.read_lane_events`)."""

LANE_EVENTS_FLOOR_NAMESPACE = "harness.lane.events_floor"
"""Per lane name, the ordinal of the oldest event its trimmed event log still shows."""


def session_name() -> ValueAddress[str]:
    return ValueAddress("harness.session.name", "", _TEXT)


def entry_label(entry_id: str) -> ValueAddress[str]:
    return ValueAddress("harness.entry.label", entry_id, _TEXT)
