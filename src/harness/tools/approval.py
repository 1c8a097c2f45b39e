"""Approval of tool calls that change things: a `before_tool` hook that asks someone first."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from pydantic import JsonValue

from harness.context import Context
from harness.runtime import Block, ToolCallRequest
from harness.tools.workspace import plural

NEEDS_APPROVAL: frozenset[str] = frozenset({"write", "edit", "shell"})
"""The built-in tools that change files or run commands, and so ask before they run."""


@dataclass(frozen=True)
class Approval:
    """An answer to an approval request: run the call (`allow`), and with `for_session` every
    later call of the same tool too, without asking; a refusal's `reason` is told to the model."""

    allow: bool
    for_session: bool = False
    reason: str | None = None


ALLOW_ONCE = Approval(allow=True)
ALLOW_FOR_SESSION = Approval(allow=True, for_session=True)
DENY = Approval(allow=False)


@dataclass(frozen=True)
class ApprovalRequest:
    """A tool call waiting for approval: what a person is shown. `summary` is one line, e.g.
    `shell: make test` or `write src/app.py (120 bytes)`."""

    operation_id: str
    tool_call_id: str
    tool_name: str
    args: dict[str, JsonValue]
    summary: str


AskApproval = Callable[[ApprovalRequest, Context], Awaitable[Approval]]
"""Ask whoever can decide (the terminal chat asks the person); it may take as long as they do."""


class ApprovalPolicy:
    """A `before_tool` hook (pass the policy itself as `RunHooks.before_tool`): calls of tools in
    `gated` run only when allowed for the session or when `ask` allows them; other calls run.

    It fails closed: with no `ask` (nobody to ask, as in `harness run` without `--yes`), when `ask`
    raises, or when the Context is cancelled while asking, the call is blocked with a reason the
    model reads. `allow_for_session(name)` (or an `Approval` with `for_session`) stops asking for
    that tool until the policy is dropped."""

    def __init__(self, ask: AskApproval | None, *, gated: Iterable[str] = NEEDS_APPROVAL,
                 allowed: Iterable[str] = (), unavailable_reason: str | None = None) -> None:
        self._ask = ask
        self.gated = frozenset(gated)
        self._allowed: set[str] = set(allowed)
        self._unavailable_reason = unavailable_reason or "nobody is available to approve it"

    @classmethod
    def allow_all(cls) -> ApprovalPolicy:
        """A policy that runs every call (what `--yes` means)."""
        return cls(None, gated=())

    @property
    def allowed_for_session(self) -> frozenset[str]:
        return frozenset(self._allowed)

    def allow_for_session(self, tool_name: str) -> None:
        self._allowed.add(tool_name)

    def needs_approval(self, tool_name: str) -> bool:
        return tool_name in self.gated and tool_name not in self._allowed

    async def __call__(self, request: ToolCallRequest, context: Context) -> Block | None:
        if not self.needs_approval(request.tool_name):
            return None
        if self._ask is None:
            return Block(reason=f"`{request.tool_name}` needs approval and {self._unavailable_reason}")
        asked = ApprovalRequest(operation_id=request.operation_id, tool_call_id=request.tool_call_id,
                                tool_name=request.tool_name, args=dict(request.args),
                                summary=describe_call(request.tool_name, request.args))
        try:
            answer = await self._ask(asked, context)
        except Exception as error:  # approval fails closed
            return Block(reason=f"the approval check failed ({type(error).__name__}: {error}), so it did not run")
        if context.cancelled:
            return Block(reason="the approval was cancelled")
        if not isinstance(answer, Approval) or not answer.allow:
            reason = answer.reason if isinstance(answer, Approval) and answer.reason else None
            return Block(reason=f"the person declined it: {reason}" if reason else "the person declined it")
        if answer.for_session:
            self._allowed.add(request.tool_name)
        return None


def describe_call(tool_name: str, args: dict[str, JsonValue], limit: int = 200) -> str:
    """One line saying what a call would do, for approval prompts and compact transcripts."""
    match tool_name, args:
        case "shell", {"command": str(command), "background": str(mode)}:
            text = f"shell ({mode} in the background): {' '.join(command.split())}"
        case "shell", {"command": str(command)}:
            text = f"shell: {' '.join(command.split())}"
        case "write", {"path": str(path), "content": str(content)}:
            text = f"write {path} ({plural(len(content.encode()), 'byte')})"
        case "edit", {"path": str(path)}:
            text = f"edit {path}"
        case _:
            text = f"{tool_name} {json.dumps(args, ensure_ascii=False)}"
    return text if len(text) <= limit else text[: limit - 1] + "…"
