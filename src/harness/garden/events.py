"""The garden's event feed: one JSON line per event in the runtime root's `events.jsonl`, appended
whole, readable from any process."""

from __future__ import annotations

import logging
from typing import Annotated, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from harness.garden.operator_messages import read_operator_message_records
from harness.garden.records import GoalState, GoalType
from harness.garden.root import RuntimeRoot, read_lines
from harness.messages import now_ms

logger = logging.getLogger("harness.garden")

RunStatus: TypeAlias = Literal["completed", "failed", "aborted", "suspended", "waiting_retry"]
"""How a gardener's run ended: settled (`completed`, `failed`, `aborted`) or not yet
(`suspended` on a deferred reply, `waiting_retry` after a transient failure)."""


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    at: int = Field(default_factory=now_ms)
    goal_id: str


class TendFinished(_Event):
    """A tend goal's run ended. `operator_note_written` and `operator_note_path` come from that
    run's validated `tend_survey` records: written when there is any, the path that of the last
    (None when it wrote no file) (OM-9)."""

    type: Literal["tend_finished"] = "tend_finished"
    run_id: str
    status: RunStatus
    operator_note_written: bool
    operator_note_path: str | None


class RunFinished(_Event):
    """A durable or converse goal's run ended."""

    type: Literal["run_finished"] = "run_finished"
    goal_type: GoalType
    run_id: str
    status: RunStatus


class GoalChanged(_Event):
    """A goal's status changed."""

    type: Literal["goal_status"] = "goal_status"
    status: GoalState


GardenEvent: TypeAlias = Annotated[TendFinished | RunFinished | GoalChanged, Field(discriminator="type")]

_EVENT: TypeAdapter[GardenEvent] = TypeAdapter(GardenEvent)


def tend_finished(root: RuntimeRoot, goal_id: str, run_id: str, status: RunStatus) -> TendFinished:
    """The `tend_finished` event of run `run_id`, derived from its records, never from the inbox
    (OM-9)."""
    surveys = [record for record in read_operator_message_records(run_id, root=root) if record.kind == "tend_survey"]
    return TendFinished(goal_id=goal_id, run_id=run_id, status=status, operator_note_written=bool(surveys),
                        operator_note_path=surveys[-1].delivery_path if surveys else None)


def publish(root: RuntimeRoot, event: GardenEvent) -> None:
    """Append `event` to the feed (blocking: a locked append of one line)."""
    root.append_line(root.events_file, event.model_dump(mode="json"))


def read_garden_events(root: RuntimeRoot) -> list[GardenEvent]:
    """Every event of the feed, oldest first; a line this version cannot read is logged and left out."""
    events = []
    for line in read_lines(root.events_file):
        try:
            events.append(_EVENT.validate_python(line))
        except ValidationError as error:
            logger.error("garden %s: an event this version does not know: %s", root.name, error.errors()[0]["msg"])
    return events
