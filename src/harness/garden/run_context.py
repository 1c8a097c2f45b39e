"""The run context: which garden, goal and run the code now running works for, and who called it.

The garden's driver sets it around each of the gardener's runs: a `contextvars` value for code in
this process (the gardener's tools run in tasks that inherit it) and `HARNESS_GARDEN_*` variables
in the environment of the subprocesses those tools start. Operator messages read it from there and
nowhere else (OM-7). It is not the harness `Context` every call takes last: that one carries a
call's cancellation and telemetry and is never stored.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.conversation import ConversationService

ENVIRONMENT_PREFIX = "HARNESS_GARDEN_"

_FIELDS = {
    "garden": "HARNESS_GARDEN_NAME",
    "root": "HARNESS_GARDEN_ROOT",
    "goal_id": "HARNESS_GARDEN_GOAL_ID",
    "goal_type": "HARNESS_GARDEN_GOAL_TYPE",
    "run_id": "HARNESS_GARDEN_RUN_ID",
    "caller": "HARNESS_GARDEN_CALLER",
    "store_url": "HARNESS_GARDEN_STORE",
}


@dataclass(frozen=True)
class RunContext:
    """The garden `garden` with runtime root `root`, the goal (`goal_id`, `goal_type`) and the run
    (`run_id`, the harness operation id) now running, and `caller`, who runs the code (`gardener`
    for the gardener's own runs). `store_url` names the journal holding the goal's conversations,
    for an emitter in a subprocess; in this process `service` is the garden's own conversation
    service, and never leaves it."""

    garden: str
    root: Path
    goal_id: str
    goal_type: str
    run_id: str
    caller: str
    store_url: str | None = None
    service: ConversationService | None = None

    def environment(self) -> dict[str, str]:
        """The `HARNESS_GARDEN_*` variables that carry this context into a subprocess."""
        values = {"garden": self.garden, "root": str(self.root), "goal_id": self.goal_id,
                  "goal_type": self.goal_type, "run_id": self.run_id, "caller": self.caller,
                  "store_url": self.store_url}
        return {_FIELDS[key]: value for key, value in values.items() if value is not None}


_CURRENT: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar("harness_garden_run", default=None)


@contextmanager
def running(run: RunContext) -> Iterator[RunContext]:
    """Make `run` the current run context for the code inside (and the tasks it starts)."""
    token = _CURRENT.set(run)
    try:
        yield run
    finally:
        _CURRENT.reset(token)


def current_run_context(environ: Mapping[str, str] | None = None) -> RunContext | None:
    """The run context of the running code: this process's, else the one `HARNESS_GARDEN_*` in
    `environ` (default `os.environ`) carry when every required one is set and not empty; None when
    there is neither."""
    inside = _CURRENT.get()
    if inside is not None:
        return inside
    env = os.environ if environ is None else environ
    values = {key: env.get(variable, "") for key, variable in _FIELDS.items()}
    if not all(values[key] for key in _FIELDS if key != "store_url"):
        return None
    return RunContext(garden=values["garden"], root=Path(values["root"]), goal_id=values["goal_id"],
                      goal_type=values["goal_type"], run_id=values["run_id"], caller=values["caller"],
                      store_url=values["store_url"] or None)
