"""Harness's own session file: export a session as JSONL and import such a file into a new session.

The file is one JSON object per line, each with a `type`:

- first, `{"type": "session", "format": "harness", "version": 1, "session_id", "created_at",
  "parent_session_id", "forked_from_entry_id", "name"}` (the source session; `name` may be null);
- `{"type": "entry", "id", "parent_id", "seq", "timestamp", "payload"}` for each entry, in commit
  order (a parent always comes before its children); `payload` is the entry payload as stored;
- `{"type": "lane", "name", "tip_id", "config", "last_result"}` for each lane;
- `{"type": "label", "entry_id", "label"}` for each labelled entry;
- `{"type": "usage", "id", "entry_id", "adjustment", "usage", "details"}` for each usage ledger
  row, in ledger order.

An import writes a new session (new session id) with the same entries (ids, parent links and
payloads), lane tips, configurations and last results, labels, name and usage rows (ids, entries,
amounts, in order), owned by the importing user. What the store assigns is new: the session id, `seq` numbers and commit
timestamps (each message's own `timestamp` is in its payload and kept).

What an export leaves out: an open operation and its records (frames, tool arguments,
checkpoints; the imported lane is idle, and the export warns), queued messages, and application
records outside the harness's own addresses. Every entry is exported, abandoned branches too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TextIO

from pydantic import BaseModel, ConfigDict, JsonValue, ValidationError

from harness.context import Context
from harness.conversation.service import OWNER
from harness.imports.plan import ImportPlan, ImportReport, Raw, count_branch, read_jsonl
from harness.messages import Usage
from harness.session import (
    Entry,
    EntryPayload,
    LaneConfig,
    LaneLastResult,
    LaneState,
    SessionMutator,
    SessionReader,
    Store,
    addresses,
)

FORMAT: Literal["harness"] = "harness"
VERSION: Literal[1] = 1
_PAGE = 500


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SessionHeader(_Record):
    type: Literal["session"] = "session"
    format: Literal["harness"] = FORMAT
    version: Literal[1] = VERSION
    session_id: str
    created_at: int
    parent_session_id: str | None = None
    forked_from_entry_id: str | None = None
    name: str | None = None


class EntryRecord(_Record):
    type: Literal["entry"] = "entry"
    id: str
    parent_id: str | None
    seq: int
    timestamp: int
    payload: EntryPayload


class LaneRecord(_Record):
    type: Literal["lane"] = "lane"
    name: str
    tip_id: str | None
    config: LaneConfig
    last_result: LaneLastResult | None = None


class LabelRecord(_Record):
    type: Literal["label"] = "label"
    entry_id: str
    label: str


class UsageRecord(_Record):
    type: Literal["usage"] = "usage"
    id: str
    entry_id: str | None = None
    adjustment: bool = False
    usage: Usage
    details: JsonValue = None


@dataclass
class ExportReport:
    """What an export wrote: counts of each record kind, and what it could not carry."""

    session_id: str
    entries: int = 0
    lanes: int = 0
    labels: int = 0
    usage_rows: int = 0
    warnings: list[str] = field(default_factory=list)


# -- export ---------------------------------------------------------------------------------------


async def export_harness_session(session: SessionReader, out: TextIO, context: Context) -> ExportReport:
    """Write `session` to `out` as harness JSONL (the module docstring gives the format).

    Reads only; the session may be in use by a harness meanwhile, but an export taken then may
    be mid-run (its open operation is left out, with a warning). Raises `StorageCorruption` if
    an entry cannot be decoded."""
    report = ExportReport(session_id=session.id)
    name = await session.get(addresses.session_name(), context)
    lanes: list[LaneRecord] = []
    for lane in await session.lanes(context):
        config = await session.get(addresses.lane_config(lane), context)
        if config is None:
            report.warnings.append(f"lane {lane} has no configuration; it is left out")
            continue
        state = await session.get(addresses.lane_state(lane), context) or LaneState()
        if state.current_operation_id is not None:
            report.warnings.append(f"lane {lane} has an open operation ({state.current_operation_id}); it is "
                                   "exported without it, idle at its current tip")
        if state.inbox:
            report.warnings.append(f"lane {lane} has {len(state.inbox)} queued messages; they are not exported")
        tip = await session.get(addresses.branch_tip(lane), context)
        last_result = await session.get(addresses.lane_last_result(lane), context)
        lanes.append(LaneRecord(name=lane, tip_id=tip, config=config, last_result=last_result))
    labels = await session.scan_values(addresses.entry_label(""), context)
    usage = []
    after: int | None = None
    while page := await session.usage_ledger(context, after_seq=after, limit=_PAGE):
        usage.extend(page)
        after = page[-1].seq

    entries: list[Entry] = []  # every entry, abandoned branches included, in commit order
    after = None
    while entry_page := await session.read_entries(context, after_seq=after, limit=_PAGE):
        entries.extend(entry_page)
        after = entry_page[-1].seq
    known = {entry.id for entry in entries}

    info = session.info
    _write(out, SessionHeader(session_id=info.id, created_at=info.created_at, parent_session_id=info.parent_session_id,
                              forked_from_entry_id=info.forked_from_entry_id, name=name))
    for entry in entries:
        _write(out, EntryRecord(id=entry.id, parent_id=entry.parent_id, seq=entry.seq, timestamp=entry.timestamp,
                                payload=entry.payload))
    for lane_record in lanes:
        _write(out, lane_record)
    for labelled, label in labels:
        if labelled in known:
            _write(out, LabelRecord(entry_id=labelled, label=label))
            report.labels += 1
    for row in usage:
        used_by = row.entry_id if row.entry_id in known else None
        if row.entry_id is not None and used_by is None:
            report.warnings.append(f"usage row {row.id} names entry {row.entry_id}, which does not exist")
        _write(out, UsageRecord(id=row.id, entry_id=used_by, adjustment=row.adjustment, usage=row.usage,
                                details=row.details))
    report.entries, report.lanes, report.usage_rows = len(entries), len(lanes), len(usage)
    return report


def _write(out: TextIO, record: BaseModel) -> None:
    out.write(record.model_dump_json() + "\n")


# -- import ---------------------------------------------------------------------------------------


@dataclass
class _Parsed:
    header: SessionHeader
    entries: list[EntryRecord] = field(default_factory=list)
    lanes: list[LaneRecord] = field(default_factory=list)
    labels: list[LabelRecord] = field(default_factory=list)
    usage: list[UsageRecord] = field(default_factory=list)


IMPORTED_SUFFIX = " (imported)"
"""Added to an imported session's name."""

_RECORDS: dict[str, type[_Record]] = {"entry": EntryRecord, "lane": LaneRecord, "label": LabelRecord,
                                      "usage": UsageRecord}


async def import_harness_session(store: Store, path: str | Path, user: str, context: Context) -> ImportReport:
    """Read a harness JSONL file (as `export_harness_session` writes it) into a new conversation of
    `user` in `store` (its owner, as the other importers record it), named as the original with
    `IMPORTED_SUFFIX`, in one transaction, and return what was written.

    The whole file is checked first: raises `UnsupportedFormat` (nothing written) when the first
    line is not a harness `session` header of version 1, a record does not have its type's shape,
    an entry id repeats or names a parent that comes later or not at all, or a lane, label or
    usage row names an entry the file does not hold; `InvalidInput` when the file cannot be read."""
    context.raise_if_cancelled()
    plan = ImportPlan("harness", Path(path))
    parsed = _parse(plan, await read_jsonl(Path(path), plan))
    session = await store.create_session(context)

    async def write(m: SessionMutator) -> None:
        for entry in parsed.entries:
            m.insert_entry(entry.payload, parent_id=entry.parent_id, entry_id=entry.id)
        for label in parsed.labels:
            m.set(addresses.entry_label(label.entry_id), label.label)
        if parsed.header.name is not None:
            # Marked, so a name given as SESSION still names one session when the original is in the store too.
            m.set(addresses.session_name(), parsed.header.name + IMPORTED_SUFFIX)
        m.set(OWNER, user)
        for lane in parsed.lanes:
            m.set(addresses.branch_tip(lane.name), lane.tip_id)
            m.set(addresses.lane_config(lane.name), lane.config)
            m.set(addresses.lane_state(lane.name), LaneState())
            if lane.last_result is not None:
                m.set(addresses.lane_last_result(lane.name), lane.last_result)
        for row in parsed.usage:
            m.insert_usage(row.usage, usage_id=row.id, entry_id=row.entry_id, adjustment=row.adjustment,
                           details=row.details)

    await session.mutate(write, context)
    branch = _main_branch(parsed)
    counts = count_branch(branch)
    return ImportReport(session_id=session.id, source_format="harness", messages=counts.messages,
                        tool_calls=counts.tool_calls, unanswered_tool_calls=counts.unanswered,
                        compactions=counts.compactions, entries=len(parsed.entries), skipped={},
                        warnings=list(plan.warnings))


def _parse(plan: ImportPlan, records: list[tuple[int, Raw]]) -> _Parsed:
    first_line, first = records[0]
    if first.get("type") != "session" or first.get("format") != FORMAT:
        raise plan.unsupported(first_line, "not a harness session file (the first line must be a harness "
                                           "`session` header)")
    if first.get("version") != VERSION:
        raise plan.unsupported(first_line, f"harness session file version {first.get('version')!r} is not "
                                           f"supported (this version reads {VERSION})")
    with plan.reading(first_line):
        parsed = _Parsed(SessionHeader.model_validate(first, strict=False))
    seen: set[str] = set()
    usage_ids: set[str] = set()
    for line, raw in records[1:]:
        kind = raw["type"]
        model = _RECORDS.get(kind)
        if model is None:
            raise plan.unsupported(line, f"unknown record type {kind!r}")
        try:
            record = model.model_validate(raw, strict=False)
        except ValidationError as error:
            raise plan.unsupported(line, f"record does not have the expected shape: {error}") from error
        if isinstance(record, EntryRecord):
            if record.id in seen:
                raise plan.unsupported(line, f"entry {record.id} appears twice")
            if record.parent_id is not None and record.parent_id not in seen:
                raise plan.unsupported(line, f"entry {record.id} names parent {record.parent_id}, which does "
                                             "not come before it")
            seen.add(record.id)
            parsed.entries.append(record)
        elif isinstance(record, LaneRecord):
            _check_named(plan, line, seen, record.tip_id, f"lane {record.name}")
            parsed.lanes.append(record)
        elif isinstance(record, LabelRecord):
            _check_named(plan, line, seen, record.entry_id, "a label")
            parsed.labels.append(record)
        elif isinstance(record, UsageRecord):
            _check_named(plan, line, seen, record.entry_id, f"usage row {record.id}")
            if record.id in usage_ids or record.id in seen:
                raise plan.unsupported(line, f"usage row id {record.id} is already used")
            usage_ids.add(record.id)
            parsed.usage.append(record)
    if len({lane.name for lane in parsed.lanes}) != len(parsed.lanes):
        raise plan.unsupported(None, "a lane appears twice")
    return parsed


def _check_named(plan: ImportPlan, line: int, seen: set[str], entry_id: str | None, who: str) -> None:
    if entry_id is not None and entry_id not in seen:
        raise plan.unsupported(line, f"{who} names entry {entry_id}, which is not in the file before it")


def _main_branch(parsed: _Parsed) -> list[EntryPayload]:
    """The payloads on lane `main`'s branch (else the first lane's), root first, for the report."""
    lanes = sorted(parsed.lanes, key=lambda lane: lane.name != "main")
    if not lanes:
        return []
    by_id = {entry.id: entry for entry in parsed.entries}
    branch: list[EntryPayload] = []
    current = lanes[0].tip_id
    while current is not None:
        entry = by_id[current]
        branch.append(entry.payload)
        current = entry.parent_id
    return branch[::-1]
