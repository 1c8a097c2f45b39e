"""The harness: attach to a session, accept runs atomically, inspect and watch lanes (HA-1 to HA-30)."""

from harness.messages import ModelIdentity
from harness.runtime.bus import Listener
from harness.runtime.errors import (
    HarnessClosed,
    HarnessFault,
    InvalidMessage,
    LaneBusy,
    NoActiveOperation,
    OperationIdTaken,
    RebaseRequired,
    UnknownSkill,
    UnknownTemplate,
)
from harness.runtime.events import (
    DeferredHandle,
    EventDelivery,
    HarnessEvent,
    PendingWrite,
    QueuedItem,
    Queues,
)
from harness.runtime.harness import AgentHarness, AgentHarnessOptions
from harness.runtime.lane import AbortRequest, AcceptedRun, Lane, LaneWatch
from harness.runtime.requests import PromptRequest, PromptTemplate, RunRequest, Skill, SkillRequest, TemplateRequest
from harness.runtime.snapshot import reduce_lane_snapshot
from harness.runtime.tools import AgentTool, ToolOutput
from harness.runtime.types import (
    CurrentOperationInfo,
    DeferredInfo,
    DrainedQueues,
    LaneExecutionInfo,
    LaneInfo,
    LaneSnapshot,
    OpenOperation,
    OperationError,
    OperationStatus,
    RetryInfo,
    RunningTool,
    SnapshotOperation,
)
from harness.session import LaneConfig, LaneLastResult

__all__ = [
    "AbortRequest",
    "AcceptedRun",
    "AgentHarness",
    "AgentHarnessOptions",
    "AgentTool",
    "CurrentOperationInfo",
    "DeferredHandle",
    "DeferredInfo",
    "DrainedQueues",
    "EventDelivery",
    "HarnessClosed",
    "HarnessEvent",
    "HarnessFault",
    "InvalidMessage",
    "Lane",
    "LaneBusy",
    "LaneConfig",
    "LaneExecutionInfo",
    "LaneInfo",
    "LaneLastResult",
    "LaneSnapshot",
    "LaneWatch",
    "Listener",
    "ModelIdentity",
    "NoActiveOperation",
    "OpenOperation",
    "OperationError",
    "OperationIdTaken",
    "OperationStatus",
    "PendingWrite",
    "PromptRequest",
    "PromptTemplate",
    "QueuedItem",
    "Queues",
    "RebaseRequired",
    "RetryInfo",
    "RunRequest",
    "RunningTool",
    "Skill",
    "SkillRequest",
    "SnapshotOperation",
    "TemplateRequest",
    "ToolOutput",
    "UnknownSkill",
    "UnknownTemplate",
    "reduce_lane_snapshot",
]
