"""A lane's event log: every durable event with its sequence number, written in the commit of the
fact it describes, so a watcher that reconnects can continue after the last event it saw.

Durable events are the lane events a committing job emits from its commit continuation: runs
starting, suspending, resuming and ending, abort requests, messages placed on the branch and
their `entry_added`, a step's `turn_start` (its intent commit) and `turn_end`, a tool call's
`tool_start` (its intent commit) and `tool_end` (its outcome staged), retries, compactions and
navigations, `queue_update`, `config_update` and `usage`. Live presentation is not logged and
carries `event_seq` None: the streaming reply (`message_start`/`message_update` before the reply
commits), `tool_update` progress and the `tool_start` of a replay-safe call run again after a
restart; a fresh snapshot shows that state. So do session-wide events (`value_update`: they
belong to no lane), `lane_created` (it comes before any watch of the lane), `handler_error` and
`fault`.

The sequence number is the seq of the log item, from the session's one seq counter: strictly
increasing per lane (and across the session), not consecutive. The log is bounded: each
operation's settlement keeps the newest `event_log_limit` items of its lane (default 10,000, a few
hundred turns), since a watcher that far behind reads a snapshot faster than it replays; between
two settlements the log grows by one operation's events. An entry's events are stored as a
reference to the entry, not a second copy of its message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, TypeAdapter

from harness.context import Context
from harness.messages import AssistantMessage, Message, ToolResultMessage
from harness.runtime.events import EntryAdded, HarnessEvent, MessageEnd, MessageStart, RunEnd, TurnEnd, event_lane
from harness.session import (
    CommitResult,
    CustomMessagePayload,
    Entry,
    EntryPayload,
    ListAddress,
    ListItem,
    MessagePayload,
    SessionMutator,
    SessionReader,
    StorageCorruption,
)
from harness.session.addresses import LANE_EVENTS_NAMESPACE

EntryEventKind = Literal["message_start", "message_end", "entry_added"]

DURABLE_EVENT_TYPES = frozenset({
    "run_start", "run_end", "run_suspend", "run_resume", "operation_abort", "message_start", "message_end",
    "entry_added", "turn_start", "turn_end", "tool_start", "tool_end", "retry_scheduled", "retry_start",
    "retry_end", "compaction_start", "compaction_end", "navigation_start", "navigation_end", "queue_update",
    "config_update", "usage",
})
"""The lane event kinds that are logged, with their `event_seq`, when a committing job emits them."""

DEFAULT_EVENT_LOG_LIMIT = 10_000
"""How many events a lane's log keeps after a settlement (`AgentHarnessOptions.event_log_limit`)."""


@dataclass(frozen=True)
class EntryEvent:
    """An event about an entry its commit inserts, before the commit: `entry_added` needs the
    commit's seq and timestamp. `position` is the entry's index among the commit's writes."""

    kind: EntryEventKind
    lane: str
    entry_id: str
    parent_id: str | None
    payload: EntryPayload
    position: int

    def event(self, result: CommitResult, event_seq: int | None) -> HarnessEvent:
        """The published event, once `result` has committed the entry."""
        if self.kind == "entry_added":
            entry = Entry(id=self.entry_id, parent_id=self.parent_id, seq=result.seqs[self.position],
                          timestamp=result.timestamp, payload=self.payload)
            return EntryAdded(lane=self.lane, entry=entry, event_seq=event_seq)
        return _message_event(self.kind, self.lane, self.entry_id, self.payload, event_seq)


@dataclass(frozen=True)
class TurnEndOf:
    """A `turn_end` whose reply and tool results are entries on the branch (`message_entry_id`,
    `result_entry_ids` in the event's order): the log keeps their ids, not second copies."""

    event: TurnEnd
    message_entry_id: str
    result_entry_ids: tuple[str, ...] = ()


Announcement: TypeAlias = HarnessEvent | EntryEvent | TurnEndOf
"""What a job announces before its commit: an event, or one whose messages are entries."""


def entry_events(lane: str, entry_id: str, parent_id: str | None, payload: EntryPayload,
                 position: int) -> list[EntryEvent]:
    """`message_start` and `message_end` (for a message) and `entry_added` of a placed entry."""
    kinds: list[EntryEventKind] = (["message_start", "message_end"]
                                   if isinstance(payload, MessagePayload | CustomMessagePayload) else [])
    return [EntryEvent(kind, lane, entry_id, parent_id, payload, position) for kind in [*kinds, "entry_added"]]


class _EntryRef(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: EntryEventKind
    lane: str
    entry_id: str


class _TurnRef(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    lane: str
    operation_id: str
    turn_id: str
    message_entry_id: str
    result_entry_ids: tuple[str, ...] = ()


class LoggedEvent(BaseModel):
    """One item of a lane's event log: the event as published (without its `event_seq`, which is
    the item's seq), or the ids of the entries it was made of."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    event: HarnessEvent | None = None
    entry: _EntryRef | None = None
    turn: _TurnRef | None = None


_LOGGED = TypeAdapter(LoggedEvent)


def lane_events(lane: str) -> ListAddress[LoggedEvent]:
    """The address of lane `lane`'s event log."""
    return ListAddress(LANE_EVENTS_NAMESPACE, lane, _LOGGED)


def stage_events(m: SessionMutator, announced: Sequence[Announcement], limit: int) -> list[int | None]:
    """Append the lane events of `announced` to their lanes' logs in `m`'s commit; returns, per
    announcement, the index of its log item among the commit's writes (None: not logged). A lane
    whose operation settles here is trimmed to its newest `limit` events."""
    positions: list[int | None] = []
    settled: list[str] = []
    for item in announced:
        if isinstance(item, EntryEvent):
            positions.append(m.staged)
            m.append(lane_events(item.lane),
                     LoggedEvent(entry=_EntryRef(kind=item.kind, lane=item.lane, entry_id=item.entry_id)))
            continue
        if isinstance(item, TurnEndOf):
            end = item.event
            positions.append(m.staged)
            m.append(lane_events(end.lane), LoggedEvent(turn=_TurnRef(
                lane=end.lane, operation_id=end.operation_id, turn_id=end.turn_id,
                message_entry_id=item.message_entry_id, result_entry_ids=item.result_entry_ids)))
            continue
        lane = event_lane(item)
        if lane is None or item.type not in DURABLE_EVENT_TYPES:
            positions.append(None)
            continue
        positions.append(m.staged)
        m.append(lane_events(lane), LoggedEvent(event=item))
        if isinstance(item, RunEnd):
            settled.append(lane)
    for lane in settled:
        m.trim_list(lane_events(lane), limit)
    return positions


def published(announced: Sequence[Announcement], result: CommitResult | None,
              positions: Sequence[int | None] | None) -> list[HarnessEvent]:
    """The events of a job's announcements as they are published after its commit, each durable
    one carrying its log item's seq as `event_seq`."""
    events: list[HarnessEvent] = []
    for index, item in enumerate(announced):
        position = positions[index] if positions is not None else None
        event_seq = result.seqs[position] if result is not None and position is not None else None
        if isinstance(item, EntryEvent):
            assert result is not None, "an entry's events come from the commit that inserts it"
            events.append(item.event(result, event_seq))
        elif isinstance(item, TurnEndOf):
            events.append(item.event if event_seq is None else item.event.model_copy(update={"event_seq": event_seq}))
        else:
            events.append(item if event_seq is None else item.model_copy(update={"event_seq": event_seq}))
    return events


@dataclass(frozen=True)
class LaneEventPage:
    """A page of a lane's event log.

    `events` are the durable events after the `after_seq` asked for, oldest first, as they were
    published (each with its `event_seq`), at most the page's limit; continue from the last one.
    `holds` is True when the log still held `after_seq`, so `events` follow it with no gap; False
    when it was trimmed past it, never reached it, or no `after_seq` was given: then take a
    snapshot (`Lane.watch`). `newest_seq` is the newest event seq in the log (None when empty)."""

    events: tuple[HarnessEvent, ...]
    holds: bool
    newest_seq: int | None


async def read_lane_events(reader: SessionReader, lane: str, after_seq: int | None, limit: int,
                           context: Context) -> LaneEventPage:
    """Read lane `lane`'s durable events after `after_seq` (None: from the oldest kept), at most
    `limit` (clamped to 1 to 10,000), from any reader of the session: a harness's or a cold one
    (`Store.open_session`), live or after a restart. Raises `StorageCorruption` when an item or the
    entry it refers to is missing or does not decode."""
    items = await reader.read_list(lane_events(lane), context, after_seq=after_seq, limit=limit)
    # The bounds are read after the items: a trim in between can only make `holds` False.
    bounds = await reader.list_bounds(lane_events(lane), context)
    events = await _decoded(reader, lane, items, context)
    holds = (after_seq is not None and bounds is not None and bounds[0] <= after_seq <= bounds[1])
    return LaneEventPage(events=events, holds=holds, newest_seq=bounds[1] if bounds else None)


async def read_lane_events_from(reader: SessionReader, lane: str, seq: int, limit: int,
                                context: Context) -> tuple[HarnessEvent, ...] | None:
    """Lane `lane`'s durable events after its event `seq`, oldest first, at most `limit`; None
    when the log no longer holds event `seq` (trimmed past it). What `read_lane_events` answers
    for a position the log held, in one read of the log instead of two (plus one for the entries
    the events name): the item at `seq` is read too, and finding it proves no gap. For a reader
    that reads at every commit (`follow_lane`). Raises `StorageCorruption` as `read_lane_events`."""
    items = await reader.read_list(lane_events(lane), context, after_seq=seq - 1, limit=min(limit, 10_000) + 1)
    if not items or items[0].seq != seq:
        return None
    return await _decoded(reader, lane, items[1:], context)


async def newest_event_seq(reader: SessionReader, lane: str, context: Context) -> int | None:
    """The seq of lane `lane`'s newest logged event; None when its log is empty."""
    bounds = await reader.list_bounds(lane_events(lane), context)
    return bounds[1] if bounds else None


async def _decoded(reader: SessionReader, lane: str, items: Sequence[ListItem[LoggedEvent]],
                   context: Context) -> tuple[HarnessEvent, ...]:
    """The published events of log items `items`, their entries read in one go."""
    refs: list[str] = []
    for item in items:
        if item.item.entry is not None:
            refs.append(item.item.entry.entry_id)
        if item.item.turn is not None:
            refs += [item.item.turn.message_entry_id, *item.item.turn.result_entry_ids]
    entries = await reader.entries(refs, context) if refs else {}

    def entry_of(entry_id: str, seq: int) -> Entry:
        entry = entries.get(entry_id)
        if entry is None:
            raise StorageCorruption(f"event {seq} of lane {lane} names entry {entry_id}, which is missing",
                                    lane=lane, event_seq=seq, entry_id=entry_id)
        return entry

    events: list[HarnessEvent] = []
    for item in items:
        logged, seq = item.item, item.seq
        if logged.event is not None:
            events.append(logged.event.model_copy(update={"event_seq": seq}))
        elif logged.entry is not None:
            ref, entry = logged.entry, entry_of(logged.entry.entry_id, seq)
            events.append(EntryAdded(lane=ref.lane, entry=entry, event_seq=seq) if ref.kind == "entry_added"
                          else _message_event(ref.kind, ref.lane, entry.id, entry.payload, seq))
        elif logged.turn is not None:
            turn = logged.turn
            reply = _message_of(entry_of(turn.message_entry_id, seq))
            named = [_message_of(entry_of(entry_id, seq)) for entry_id in turn.result_entry_ids]
            results = tuple(result for result in named if isinstance(result, ToolResultMessage))
            if not isinstance(reply, AssistantMessage) or len(results) != len(named):
                raise StorageCorruption(f"event {seq} of lane {lane} names entries that are no turn's reply "
                                        "and results", lane=lane, event_seq=seq)
            events.append(TurnEnd(lane=turn.lane, operation_id=turn.operation_id, turn_id=turn.turn_id,
                                  message=reply, tool_results=results, event_seq=seq))
        else:
            raise StorageCorruption(f"event {seq} of lane {lane} holds neither an event nor an entry",
                                    lane=lane, event_seq=seq)
    return tuple(events)


def _message_of(entry: Entry) -> Message:
    if not isinstance(entry.payload, MessagePayload | CustomMessagePayload):
        raise StorageCorruption(f"entry {entry.id} holds no message", entry_id=entry.id)
    return entry.payload.message


def _message_event(kind: Literal["message_start", "message_end"], lane: str, entry_id: str, payload: EntryPayload,
                   event_seq: int | None) -> HarnessEvent:
    if not isinstance(payload, MessagePayload | CustomMessagePayload):
        raise StorageCorruption(f"entry {entry_id} holds no message for its {kind}", entry_id=entry_id)
    if kind == "message_start":
        return MessageStart(lane=lane, message=payload.message, event_seq=event_seq)
    return MessageEnd(lane=lane, message=payload.message, entry_id=entry_id, event_seq=event_seq)
