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

A commit writes one log row per lane it has events for, holding them in order. The row takes one
seq of the session's seq counter per event (`SessionMutator.append`'s `span`), and an event's
sequence number is its seq: unique in the session, strictly increasing per lane, not
consecutive. An event is stored without its lane (the row's), its `event_seq` (the row's seq
less its place from the end) and its fields at their defaults; an entry's events as a reference
to the entry, not a second copy of its message. Each row also holds its first event's ordinal,
the count of the lane's events before it, so the log knows its length without reading it.

The log is bounded: an operation's settlement keeps the newest `event_log_limit` events of its
lane (default 10,000, a few hundred turns) once the log has grown past 1.1 times that, since a
watcher that far behind reads a snapshot faster than it replays; so between two trims the log
grows by a tenth of the limit and most settlements trim nothing. Rows wholly older than the
newest kept event go; the lane's floor (the ordinal of its oldest kept event) hides the older
events of the row it falls in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal, TypeAlias, get_args

from pydantic import BaseModel, ConfigDict, JsonValue, TypeAdapter, ValidationError

from harness.context import Context
from harness.messages import AssistantMessage, Message, ToolResultMessage
from harness.runtime.events import (
    EntryAdded,
    HarnessEvent,
    MessageEnd,
    MessageStart,
    RunEnd,
    ToolEnd,
    TurnEnd,
    event_lane,
)
from harness.session import (
    CommitResult,
    CustomMessagePayload,
    Entry,
    EntryPayload,
    ListAddress,
    MessagePayload,
    ReadBatch,
    SessionMutator,
    SessionReader,
    StorageCorruption,
    ValueAddress,
)
from harness.session.addresses import LANE_EVENTS_FLOOR_NAMESPACE, LANE_EVENTS_NAMESPACE

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

_PAGE = 10_000  # the most events one read returns
_TRIM_PAGE = 256  # rows one read of a trim takes: it reads about the rows it deletes, a tenth of the log


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


@dataclass(frozen=True)
class ToolEndOf:
    """A `tool_end` whose result the same commit places as entry `result_entry_id`: the log keeps
    the id, not a second copy."""

    event: ToolEnd
    result_entry_id: str


Announcement: TypeAlias = HarnessEvent | EntryEvent | TurnEndOf | ToolEndOf
"""What a job announces before its commit: an event, or one whose messages are entries."""


def entry_events(lane: str, entry_id: str, parent_id: str | None, payload: EntryPayload,
                 position: int) -> list[EntryEvent]:
    """`message_start` and `message_end` (for a message) and `entry_added` of a placed entry."""
    kinds: list[EntryEventKind] = (["message_start", "message_end"]
                                   if isinstance(payload, MessagePayload | CustomMessagePayload) else [])
    return [EntryEvent(kind, lane, entry_id, parent_id, payload, position) for kind in [*kinds, "entry_added"]]


class LogRow(BaseModel):
    """One commit's events of one lane: `first` is the ordinal of the first of them in the lane's
    log (how many events the lane logged before it), `events` their stored forms, oldest first.
    Not a `Record`: a row is built unvalidated, and the journal reads it back (an event holds
    JSON no record type bounds, such as a hook's tool arguments)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    first: int
    events: tuple[dict[str, JsonValue], ...]


_ROW = TypeAdapter(LogRow)
_FLOOR = TypeAdapter(int)
_EVENT: TypeAdapter[HarnessEvent] = TypeAdapter(HarnessEvent)
_REF = "ref"  # the key of an event stored as the entry it is about; no event has a field of that name


def lane_events(lane: str) -> ListAddress[LogRow]:
    """The address of lane `lane`'s event log."""
    return ListAddress(LANE_EVENTS_NAMESPACE, lane, _ROW)


def _lane_floor(lane: str) -> ValueAddress[int]:
    """The ordinal of lane `lane`'s oldest kept event; absent until its log is first trimmed."""
    return ValueAddress(LANE_EVENTS_FLOOR_NAMESPACE, lane, _FLOOR)


@cache
def _optional_fields(kind: type[BaseModel]) -> tuple[tuple[str, object], ...]:
    """The fields of event class `kind` a stored event may leave out: those with a plain default
    (not `type`, which names the class, nor a factory's, which would be made anew on decoding)."""
    return tuple((name, info.default) for name, info in kind.model_fields.items()
                 if name != "type" and not info.is_required() and info.default_factory is None)


@cache
def _nested_defaults_restored(kind: type[BaseModel]) -> bool:
    """Whether every model event class `kind` holds gets its left-out defaults back on decoding:
    none has a field with a default factory (made anew, e.g. a message's timestamp) or a literal
    with a default (it may tell a union's members apart, as a content block's `type` does)."""

    def restored(annotation: Any, seen: set[type]) -> bool:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if annotation in seen:
                return True
            seen.add(annotation)
            return all(info.default_factory is None and (info.is_required() or not _is_literal(info.annotation))
                       and restored(info.annotation, seen) for info in annotation.model_fields.values())
        return all(restored(argument, seen) for argument in get_args(annotation))

    return all(restored(info.annotation, {kind}) for name, info in kind.model_fields.items() if name != "type")


def _is_literal(annotation: Any) -> bool:
    return getattr(annotation, "__origin__", None) is Literal


def _dumped(event: HarnessEvent, *, without: set[str]) -> dict[str, JsonValue]:
    """`event`'s JSON form without `lane`, `event_seq`, the fields `without` and the fields at
    their defaults, nested ones too where decoding restores them."""
    # The model's serializer, called directly: `model_dump` adds a Python frame and its keyword
    # defaults to each of the few events a commit logs.
    serializer = event.__pydantic_serializer__
    if _nested_defaults_restored(type(event)):
        return {"type": event.type, **serializer.to_python(event, mode="json", exclude_defaults=True,
                                                           exclude={"lane", "event_seq", *without})}
    left_out = {"lane", *without,
                *(name for name, default in _optional_fields(type(event)) if getattr(event, name) == default)}
    dumped: dict[str, JsonValue] = serializer.to_python(event, mode="json", exclude=left_out)
    return dumped


def _stored(item: Announcement) -> dict[str, JsonValue]:
    """How `item` is kept in its row (`_dumped`); an entry's events, a `turn_end` and a `tool_end`
    whose messages are entries as references to them."""
    if isinstance(item, EntryEvent):
        return {"type": item.kind, _REF: item.entry_id}
    if isinstance(item, TurnEndOf):
        stored = _dumped(item.event, without={"message", "tool_results"})
        stored[_REF] = item.message_entry_id
        if item.result_entry_ids:
            stored["results"] = list(item.result_entry_ids)
        return stored
    if isinstance(item, ToolEndOf):
        return {**_dumped(item.event, without={"result"}), _REF: item.result_entry_id}
    return _dumped(item, without=set())


@dataclass
class _LaneLog:
    next: int  # the ordinal the lane's next event takes
    floor: int  # the ordinal of its oldest kept event


@dataclass
class StagedEvents:
    """Where a job's announcements went in its commit: per announcement, None (not logged) or the
    index of its row among the commit's writes, the row's event count and its place in the row."""

    places: list[tuple[int, int, int] | None]
    logs: dict[str, _LaneLog] = field(default_factory=dict)  # each lane's log once the commit lands

    def event_seq(self, index: int, result: CommitResult | None) -> int | None:
        place = self.places[index]
        if place is None or result is None:
            return None
        position, span, offset = place
        return result.seqs[position] - span + 1 + offset


class EventLog:
    """The lane event logs of the session a harness owns: it alone writes them, so it keeps each
    lane's length and floor once read, and trims a log only when it has grown past 1.1 times
    `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._logs: dict[str, _LaneLog] = {}

    def forget(self) -> None:
        """After a commit that failed (or whose outcome is unknown): read each log again."""
        self._logs.clear()

    async def stage(self, m: SessionMutator, announced: Sequence[Announcement], context: Context) -> StagedEvents:
        """Append one row per lane holding the lane events of `announced`, in `m`'s commit; a lane
        whose operation settles here is trimmed when its log has grown past 1.1 times the limit.
        Call `landed` with the result once the commit lands."""
        rows: dict[str, list[dict[str, JsonValue]]] = {}
        lanes: list[str | None] = []
        settled: set[str] = set()
        for item in announced:
            lane = (item.lane if isinstance(item, EntryEvent) else item.event.lane
                    if isinstance(item, TurnEndOf | ToolEndOf) else event_lane(item)
                    if item.type in DURABLE_EVENT_TYPES else None)
            lanes.append(lane)
            if lane is not None:
                rows.setdefault(lane, []).append(_stored(item))
                if isinstance(item, RunEnd):
                    settled.add(lane)
        staged = StagedEvents(places=[])
        positions: dict[str, int] = {}
        for lane, events in rows.items():
            log = self._logs.get(lane) or await self._read_log(m, lane, context)
            positions[lane] = m.staged
            # Not validated here: the events are JSON dumps of validated events, and the journal
            # reads the row's text back before it stores it.
            m.append(lane_events(lane), LogRow.model_construct(first=log.next, events=tuple(events)),
                     span=len(events))
            after = _LaneLog(next=log.next + len(events), floor=log.floor)
            if lane in settled and (after.next - after.floor) * 10 > self.limit * 11:
                after.floor = await self._trim(m, lane, after.next - self.limit, context)
            staged.logs[lane] = after
        offsets = dict.fromkeys(rows, 0)
        for lane in lanes:
            if lane is None:
                staged.places.append(None)
                continue
            staged.places.append((positions[lane], len(rows[lane]), offsets[lane]))
            offsets[lane] += 1
        return staged

    def landed(self, staged: StagedEvents) -> None:
        """In the commit continuation: the logs as the commit left them."""
        self._logs.update(staged.logs)

    async def _read_log(self, m: SessionMutator, lane: str, context: Context) -> _LaneLog:
        floor = await m.get(_lane_floor(lane), context) or 0
        bounds = await m.list_bounds(lane_events(lane), context)
        if bounds is None:
            return _LaneLog(next=floor, floor=floor)  # never written, or trimmed to nothing
        [last] = await m.read_list(lane_events(lane), context, after_seq=bounds[1] - 1, limit=1)
        return _LaneLog(next=last.item.first + len(last.item.events), floor=floor)

    async def _trim(self, m: SessionMutator, lane: str, floor: int, context: Context) -> int:
        """Stage the deletion of lane `lane`'s rows wholly older than ordinal `floor` (reading
        only them and the row after) and the new floor; returns it."""
        through: int | None = None
        after: int | None = None
        while True:
            items = await m.read_list(lane_events(lane), context, after_seq=after, limit=_TRIM_PAGE)
            for item in items:
                if item.item.first + len(item.item.events) > floor:
                    break
                through = item.seq
            else:
                if len(items) == _TRIM_PAGE:
                    after = items[-1].seq
                    continue
            break
        if through is not None:
            m.trim_list(lane_events(lane), through)
        m.set(_lane_floor(lane), floor)
        return floor


def published(announced: Sequence[Announcement], result: CommitResult | None,
              staged: StagedEvents | None) -> list[HarnessEvent]:
    """The events of a job's announcements as they are published after its commit, each durable
    one carrying its `event_seq`."""
    events: list[HarnessEvent] = []
    for index, item in enumerate(announced):
        event_seq = staged.event_seq(index, result) if staged is not None else None
        if isinstance(item, EntryEvent):
            assert result is not None, "an entry's events come from the commit that inserts it"
            events.append(item.event(result, event_seq))
        elif isinstance(item, TurnEndOf | ToolEndOf):
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
    (`Store.open_session`), live or after a restart. `after_seq` may be any event's seq, one in
    the middle of a commit's events too. Raises `StorageCorruption` when an item or the entry it
    refers to is missing or does not decode. Two round trips at most (`LogRead`)."""
    batch = reader.batch()
    log = LogRead(batch, lane, after_seq, limit)
    await batch.run(context)
    return await log.page(reader, context)


class LogRead:
    """One page of lane `lane`'s event log (`read_lane_events`), its reads queued on `batch` beside
    whatever else its caller reads at the same time (a follow's lane state and streaming reply,
    issue 29): once the batch has run, `page` reads the entries the events are made of (a second
    round trip, when there are events) and returns the page."""

    def __init__(self, batch: ReadBatch, lane: str, after_seq: int | None, limit: int) -> None:
        self._lane = lane
        self._after_seq = after_seq
        self._limit = max(1, min(limit, _PAGE))
        # The newest event of every row read is after `after_seq` (it is the row's seq) and kept (a
        # trim deletes every row wholly under the floor), so `limit` rows hold the page. The bounds
        # are read after the rows and the floor after the bounds (a batch reads in order): a trim
        # in between can only make `holds` False.
        self._rows = batch.read_list(lane_events(lane), after_seq=after_seq, limit=self._limit)
        self._bounds = batch.list_bounds(lane_events(lane))
        self._floor = batch.get(_lane_floor(lane))

    async def page(self, reader: SessionReader, context: Context) -> LaneEventPage:
        after_seq, bounds, floor = self._after_seq, self._bounds.value, self._floor.value or 0
        # Held when a kept event at or before `after_seq` is still there: the oldest row's newest
        # event is kept (a trim deletes every row wholly older than the floor), or one of the first
        # row read is.
        holds = after_seq is not None and bounds is not None and bounds[0] <= after_seq <= bounds[1]
        chosen: list[tuple[int, dict[str, JsonValue]]] = []
        for item in self._rows.value:
            first_seq = item.seq - len(item.item.events) + 1
            for offset, stored in enumerate(item.item.events):
                seq = first_seq + offset
                if item.item.first + offset < floor:
                    continue
                if after_seq is not None and seq <= after_seq:
                    holds = holds or (bounds is not None and after_seq <= bounds[1])
                    continue
                chosen.append((seq, stored))
        chosen = chosen[:self._limit]
        refs: list[str] = []
        for _, stored in chosen:
            refs += _refs(stored)
        entries = await reader.entries(refs, context) if refs else {}
        events = tuple(_event(self._lane, seq, stored, entries) for seq, stored in chosen)
        return LaneEventPage(events=events, holds=holds, newest_seq=bounds[1] if bounds else None)


async def newest_event_seq(reader: SessionReader, lane: str, context: Context) -> int | None:
    """The seq of lane `lane`'s newest logged event; None when its log is empty."""
    bounds = await reader.list_bounds(lane_events(lane), context)
    return bounds[1] if bounds else None


def _refs(stored: dict[str, JsonValue]) -> list[str]:
    """The ids of the entries a stored event is made of."""
    ref, results = stored.get(_REF), stored.get("results")
    named = [ref, *results] if isinstance(results, list) else [ref]
    return [entry_id for entry_id in named if isinstance(entry_id, str)]


def _event(lane: str, seq: int, stored: dict[str, JsonValue], entries: dict[str, Entry]) -> HarnessEvent:
    """Stored event `stored` of lane `lane`, numbered `seq`, as it was published."""

    def entry_of(entry_id: JsonValue) -> Entry:
        entry = entries.get(entry_id) if isinstance(entry_id, str) else None
        if entry is None:
            raise StorageCorruption(f"event {seq} of lane {lane} names entry {entry_id}, which is missing",
                                    lane=lane, event_seq=seq, entry_id=str(entry_id))
        return entry

    kind = stored.get("type")
    if _REF not in stored:
        try:
            return _EVENT.validate_python({**stored, "lane": lane, "event_seq": seq})
        except ValidationError as error:
            raise StorageCorruption(f"event {seq} of lane {lane} does not decode: {error}",
                                    lane=lane, event_seq=seq) from error
    entry = entry_of(stored[_REF])
    if kind == "entry_added":
        return EntryAdded(lane=lane, entry=entry, event_seq=seq)
    if kind == "message_start":
        return _message_event("message_start", lane, entry.id, entry.payload, seq)
    if kind == "message_end":
        return _message_event("message_end", lane, entry.id, entry.payload, seq)
    fields: dict[str, object] = {name: value for name, value in stored.items() if name not in (_REF, "results")}
    message, results = _message_of(entry), stored.get("results", [])
    if kind == "turn_end" and isinstance(message, AssistantMessage) and isinstance(results, list):
        named = [_message_of(entry_of(entry_id)) for entry_id in results]
        tool_results = tuple(result for result in named if isinstance(result, ToolResultMessage))
        if len(tool_results) == len(named):
            fields |= {"message": message, "tool_results": tool_results}
    elif kind == "tool_end" and isinstance(message, ToolResultMessage):
        fields["result"] = message
    try:
        return _EVENT.validate_python({**fields, "lane": lane, "event_seq": seq})
    except ValidationError as error:
        raise StorageCorruption(f"event {seq} of lane {lane} names entries that are no {kind} of theirs",
                                lane=lane, event_seq=seq) from error


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
