"""Named points in the drive where a crash matters: the crash tests kill a process at each one.

`reached(point)` is a no-op unless the process was started with `HARNESS_FAULT_POINT` naming that
point, in which case the process kills itself with SIGKILL there, as a power cut would. The crash
suite is parametrized over `FaultPoint`, so a point added here without a case fails the suite.
"""

from __future__ import annotations

import os
import signal
from enum import StrEnum

ENVIRONMENT_VARIABLE = "HARNESS_FAULT_POINT"


class FaultPoint(StrEnum):
    ASSISTANT_INTENT = "assistant_intent"  # after the provider intent commit, before the request
    MID_STREAM = "mid_stream"  # after a frame page of a streaming reply was persisted
    BEFORE_REPLY_SETTLEMENT = "before_reply_settlement"  # the reply is complete, not yet written
    TOOL_INTENT = "tool_intent"  # after a tool call's intent commit, before its effect
    TOOL_EFFECT = "tool_effect"  # while a tool's effect runs
    BEFORE_TOOL_STAGING = "before_tool_staging"  # the tool returned, its result is not yet staged
    # The batch's results and the next step's intent were one commit; its request is not yet sent.
    NEXT_STEP_INTENT = "next_step_intent"
    SUMMARY_INTENT = "summary_intent"  # after a compaction's request intent, mid-compaction
    BEFORE_TERMINAL_SETTLEMENT = "before_terminal_settlement"  # the run is done, not yet settled
    # The last reply is complete; it and the run's settlement are one commit, not yet written.
    BEFORE_FINAL_REPLY_SETTLEMENT = "before_final_reply_settlement"


_armed = os.environ.get(ENVIRONMENT_VARIABLE)


def reached(point: FaultPoint) -> None:
    """Die here if this process was told to (see the module docstring)."""
    if _armed == point.value:
        os.kill(os.getpid(), signal.SIGKILL)
