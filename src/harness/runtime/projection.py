"""A lane's projection: the small in-memory copy of its durable state (tip, configuration, state,
last result, current operation), the payloads of its queued entries and its cached branch.

Only commit continuations write it (HA-12): a job's plan reads it and stages writes, and the
continuation that runs right after the commit, without yielding, publishes the new values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from harness.context import Context
from harness.messages import ModelIdentity
from harness.runtime.branch_context import BranchContext, branch_entries
from harness.runtime.events import QueueUpdate
from harness.runtime.snapshot import LaneView, queues_of
from harness.runtime.types import CurrentOperationInfo, OperationStatus
from harness.session import (
    Entry,
    LaneConfig,
    LaneLastResult,
    LaneState,
    SessionReader,
    StorageCorruption,
    UnknownLane,
    addresses,
)
from harness.session.records import PHASES_OF_KIND, CancelRequested, OperationMeta, OperationState, PendingEntry


@dataclass
class LaneProjection:
    """What a lane's journal records say now, as the last committed job left them."""

    name: str
    tip_id: str | None
    config: LaneConfig
    state: LaneState
    last_result: LaneLastResult | None = None
    meta: OperationMeta | None = None
    operation_state: OperationState | None = None
    pending: dict[str, PendingEntry] = field(default_factory=dict)
    """Payloads of queued entries this process has read or written; the harness owns the session,
    so nothing else changes them (HA-4). Never filled at attachment (HA-3)."""
    branch: BranchContext | None = None
    """The branch since the newest compaction, built by the first step that needs it (HA-3)."""

    # -- the current operation --------------------------------------------------------------------

    def status(self, running: bool) -> OperationStatus | None:
        """`aborting`, `running` (a drive of this process holds it) or `open`; None when idle."""
        if self.operation_state is None:
            return None
        if isinstance(self.operation_state.control, CancelRequested):
            return "aborting"
        return "running" if running else "open"

    def current(self, running: bool) -> CurrentOperationInfo | None:
        meta, state, status = self.meta, self.operation_state, self.status(running)
        if meta is None or state is None or status is None:
            return None
        return CurrentOperationInfo(id=meta.operation_id, kind=meta.intent.kind, started_at=meta.started_at,
                                    status=status, captured_model=captured_model(state))

    def view(self, running: bool) -> LaneView:
        return LaneView(self.name, self.tip_id, self.state, self.last_result, self.meta, self.operation_state,
                        self.status(running))

    # -- the branch -------------------------------------------------------------------------------

    async def branch_context(self, reader: SessionReader, context: Context) -> BranchContext:
        """The branch from its newest compaction to the tip: the cached copy while it ends at the
        tip, else read once (a tip naming no entry is `StorageCorruption`). Call on the line."""
        if self.branch is None or self.branch.tip != self.tip_id:
            self.branch = BranchContext.of(await branch_entries(reader, self.tip_id, context))
        return self.branch

    def cached_entry(self, entry_id: str) -> Entry | None:
        """Entry `entry_id` from the cached branch, if the cache is current and holds it."""
        branch = self.branch
        return branch.entry(entry_id) if branch is not None and branch.tip == self.tip_id else None

    def move_tip(self, tip: str | None, placed: Sequence[Entry] = ()) -> None:
        """In a commit continuation: the tip is now `tip`, after the chain `placed` was committed on
        it. The cached branch grows when the chain continues it; otherwise the next step reads it."""
        if placed and self.branch is not None and self.branch.tip == placed[0].parent_id:
            self.branch.extend(placed)
        self.tip_id = tip

    # -- queued entries ---------------------------------------------------------------------------

    async def load_pending(self, reader: SessionReader, ids: Sequence[str], context: Context) -> None:
        """Read the stored payloads of queued entries `ids` this process has not seen yet. The
        payloads are immutable once stored, so caching them here on the line is safe."""
        for entry_id in ids:
            if entry_id not in self.pending:
                value = await reader.get(addresses.pending_entry(entry_id), context)
                if value is None:
                    raise StorageCorruption(f"queued entry {entry_id} has no stored payload", entry_id=entry_id)
                self.pending[entry_id] = value

    async def load_inbox(self, reader: SessionReader, context: Context, extra: Sequence[str] = ()) -> None:
        """Load the payloads of every queued entry (and `extra` ids): `queue_update` carries them all."""
        await self.load_pending(reader, [*(item.entry_id for item in self.state.inbox), *extra], context)

    def queue_update(self, state: LaneState, added: Mapping[str, PendingEntry] | None = None) -> QueueUpdate:
        """The `queue_update` of a commit that leaves the lane in `state`, announced before the
        commit: every payload of its inbox was loaded, or is one of `added`."""
        queues, writes = queues_of(state.inbox, {**self.pending, **added} if added else self.pending)
        return QueueUpdate(lane=self.name, queues=queues, pending_writes=writes)


def captured_model(state: OperationState) -> ModelIdentity | None:
    """The model identity the current phase captured, if it holds one (HA-6)."""
    generation = getattr(state, "generation", None)
    if generation is not None:
        model: ModelIdentity = generation.config.model
        return model
    batch = getattr(state, "batch", None)
    if batch is not None:
        model = batch.config.model
        return model
    config = getattr(state, "config", None)
    return config.model if isinstance(config, LaneConfig) else None


async def read_lane_projection(reader: SessionReader, name: str, context: Context) -> LaneProjection:
    """Lane `name`'s projection as the journal holds it: its branch tip, configuration, state,
    last result and its current operation's meta and state, nothing more (HA-2, HA-3).

    Raises `UnknownLane` when the session has no lane `name`, and `StorageCorruption` when a
    record is missing, the operation belongs to another lane or its phase does not fit its kind."""
    batch = reader.batch()  # two round trips, where one read at a time took six (issue 29)
    tip_read, config_read = batch.get_record(addresses.branch_tip(name)), batch.get(addresses.lane_config(name))
    state_read, last_read = batch.get(addresses.lane_state(name)), batch.get(addresses.lane_last_result(name))
    await batch.run(context)
    tip, config, state, last_result = tip_read.value, config_read.value, state_read.value, last_read.value
    if tip is None:
        raise UnknownLane(f"lane {name} does not exist", lane=name)
    if config is None or state is None:
        raise StorageCorruption(f"lane {name} is missing its configuration or state", lane=name)
    meta = operation_state = None
    operation_id = state.current_operation_id
    if operation_id is not None:
        meta_read = batch.get(addresses.operation_meta(operation_id))
        operation_read = batch.get(addresses.operation_state(operation_id))
        await batch.run(context)
        meta, operation_state = meta_read.value, operation_read.value
        if meta is None or operation_state is None:
            raise StorageCorruption(f"operation {operation_id} of lane {name} has no meta or state",
                                    lane=name, operation_id=operation_id)
        if meta.operation_id != operation_id or meta.lane != name:
            raise StorageCorruption(f"operation {operation_id} does not belong to lane {name}",
                                    lane=name, operation_id=operation_id)
        if operation_state.phase not in PHASES_OF_KIND[meta.intent.kind]:
            raise StorageCorruption(
                f"operation {operation_id} is a {meta.intent.kind} in phase {operation_state.phase}",
                lane=name, operation_id=operation_id)
    return LaneProjection(name, tip.value, config, state, last_result, meta, operation_state)
