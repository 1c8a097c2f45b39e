"""Driving an operation: the phases of a run, a compaction and a navigation, one group per file.

A run's durable phases and the commits between them (the arrows; `*` marks a transition that is
not committed, because a restart before the next commit resumes from the phase before it; a
checkpoint that places queued input commits `assistant_ready` with that placement):

    starting ──*──▶ checkpoint (checkpoint.py: place queued input, step ceiling, threshold)
                      │  ├──▶ summary_pending ─▶ (structural.py) ─▶ checkpoint
                      │  └──* assistant_ready ─▶ assistant_effect_pending   (provider_step.py: intent)
                      │                              │ the reply streams; frames every interval
                      │                              ▼ settlement, one commit with the reply:
                      │        run_tools ◀── tool calls      retryable ──▶ assistant_retry_wait ─* ready
                      │          │ (tool_batch.py: per call an intent, then the result placed)
                      │          ▼                            overflow ──▶ summary_pending
                      │        checkpoint                      deferred ──▶ deferred_suspended
                      │                                                     (deferred.py: poll)
                      └── nothing left to do ──▶ settled (settlement.py: the terminal commit)
    a reply without tool calls settles the run in the reply's own commit when no hook, abort or
    queued input comes between them (settlement.py: `settle_with_reply`); a reply with tool calls
    commits the intents of the safe-to-repeat ones that start at once with it when no `before_tool`
    hook or abort comes between (tool_batch.py: `with_tool_intents`); likewise the results
    completing a batch commit the next step's intent with them, straight from run_tools to
    assistant_effect_pending, when the checkpoint would only ask the model (`direct_intent`)
    any phase ── failure ──▶ failure_drain ──▶ settled failed
    any phase ── abort requested ──▶ answer what was in flight ──▶ settled aborted (a run that
    placed no reply may be discarded there, its tip back before its prompt: `RunHooks.discard_turn`)

A compaction runs summary_pending (and summary_retry_wait) to its settlement; a navigation runs
summary_pending when it summarizes the branch it leaves, then navigation_ready, then settles.

`driver.py` maps each phase to its handler; a handler returns the next transition as a value
(`Transition`: the next phase, the writes staged with it and the events after it), an outcome,
or None, and the driver commits the transition. `operation.py` holds what every handler takes.
"""

from harness.runtime.drive.driver import OperationDriver
from harness.runtime.drive.operation import DriveEnvironment

__all__ = ["DriveEnvironment", "OperationDriver"]
