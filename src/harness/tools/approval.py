"""Approval of tool calls: a `before_tool` hook that weighs the permission rules and asks someone
first when they say so, or when a call's tool asks first (`AgentTool.asks_first`) and no rule
allows it."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pydantic import JsonValue

from harness.context import Context
from harness.runtime import AgentTool, Approval, ApprovalRequest, AskApproval, Block, ToolCallRequest
from harness.tools.permissions import InvalidPermissionRule, PermissionDecision, PermissionRules, parse_rule
from harness.tools.workspace import plural

logger = logging.getLogger(__name__)

ALLOW_ONCE = Approval(allow=True)
ALLOW_FOR_SESSION = Approval(allow=True, for_session=True)
DENY = Approval(allow=False)


class Located(Protocol):
    @property
    def directory(self) -> Path: ...


class RuleKeeper(Protocol):
    """What the policy reads and writes of the conversation a call belongs to: where its tools run,
    the rules its person allowed "always", kept in its journal, and how a call of it waits for an
    answer from any process (a `Conversation` is one)."""

    @property
    def target(self) -> Located: ...

    async def allowed_always(self, context: Context) -> Sequence[str]: ...

    async def allow_always(self, rule: str, context: Context) -> bool: ...

    async def ask_approval(self, request: ApprovalRequest, context: Context, *,
                           here: AskApproval | None = None) -> Approval: ...


@dataclass(frozen=True)
class Decided:
    """How the policy decided one call, for whoever watches (`ApprovalPolicy`'s `on_decision`):
    the rules' `decision` (with the rule that decided, if one did), whether a person was `asked`,
    and whether the call `ran` (went ahead)."""

    request: ToolCallRequest
    decision: PermissionDecision
    asked: bool
    ran: bool


REMEMBERED_SOURCE = "this conversation"
"""The source of the rules a person allowed "always" in a conversation."""


class ApprovalPolicy:
    """A `before_tool` hook (pass the policy itself as `RunHooks.before_tool`, and `decides` as
    `before_tool_applies`) that weighs the permission `rules` and the conversation's "always"
    answers for each call (issue 30): a `deny` rule blocks it, an `ask` rule asks, an `allow`
    rule runs it (`mcp__github__*` allows a server's tools); a call no rule names asks when its
    tool asks first (`ToolCallRequest.asks_first`, its `AgentTool`'s: the built-in write, edit and
    shell, an MCP tool not marked read-only, a function tool made with `approval=True`), else
    runs, or runs anyway under `approve_all` (`--yes`).

    `conversation_of` gives the conversation a call belongs to (`RuleKeeper`): an answer "always"
    (`Approval.for_session`) is kept in its journal as a row the model reads and survives a
    restart, and its path rules are relative to where its tools run. Without `conversation_of`
    such answers last as long as the policy; when it gives None they are not kept (the call runs
    once). Paths are then relative to `directory` (default: this process's). `on_decision` sees
    every decision, with the rule that made it; a door may bind `conversation_of` after attaching.

    With `answered_anywhere` (issue 30) a call asks through its conversation
    (`RuleKeeper.ask_approval`): it waits, listed in the journal, for whichever answer comes
    first, one posted from any process (`harness serve`'s approvals route) or `ask`'s here (the
    terminal's prompt), so a worker or a chat is answered from the web page too.

    It fails closed: with no `ask` and no conversation to wait in (nobody to ask, as in `harness
    run` without `--yes`), when asking raises, or when the Context is cancelled while asking (the
    run was stopped), the call is blocked with a reason the model reads."""

    def __init__(self, ask: AskApproval | None, *, approve_all: bool = False,
                 rules: PermissionRules | None = None, allowed: Iterable[str] = (),
                 conversation_of: Callable[[ToolCallRequest], RuleKeeper | None] | None = None,
                 directory: Path | None = None, unavailable_reason: str | None = None,
                 on_decision: Callable[[Decided], None] | None = None, answered_anywhere: bool = False) -> None:
        self._ask = ask
        self.answered_anywhere = answered_anywhere
        self.approve_all = approve_all
        self.rules = rules or PermissionRules()
        self._allowed: set[str] = set(allowed)
        self.conversation_of = conversation_of
        self._directory = directory
        self._unavailable_reason = unavailable_reason or "nobody is available to approve it"
        self._on_decision = on_decision

    @classmethod
    def allow_all(cls, ask: AskApproval | None = None, *, rules: PermissionRules | None = None) -> ApprovalPolicy:
        """A policy that runs every call no rule denies or asks for (what `--yes` means), an MCP
        server's too."""
        return cls(ask, approve_all=True, rules=rules)

    @property
    def allowed_for_session(self) -> frozenset[str]:
        """The tools allowed "always" while no conversation keeps the answer (see the class)."""
        return frozenset(self._allowed)

    def allow_for_session(self, tool_name: str) -> None:
        self._allowed.add(tool_name)

    def decides(self, tool: AgentTool) -> bool:
        """Whether the policy has anything to say of calls of `tool` (`before_tool_applies`):
        one a deny or ask rule names, or one that `needs_approval`. The calls of the others start
        with the reply that made them, one commit fewer (issue 12)."""
        return self.rules.names(tool.name, ("deny", "ask")) or self.needs_approval(tool)

    def needs_approval(self, tool: AgentTool, allowed_always: Iterable[str] = ()) -> bool:
        """Whether a call of `tool` asks first unless a pattern says otherwise: `tool` asks first
        (and not `approve_all`) and no rule (nor `allowed_always`, a conversation's "always"
        answers) allows it by name."""
        if not tool.asks_first or self.approve_all:
            return False
        directory = self._directory or Path.cwd()  # names alone: no path is weighed
        remembered = self._remembered([*self._allowed, *allowed_always], directory)
        return (self.rules + remembered).decide(tool.name, {}, directory).effect != "allow"

    async def decide(self, request: ToolCallRequest, context: Context) -> PermissionDecision:
        """What the rules and the conversation's "always" answers say of `request` (no one asked)."""
        conversation = self.conversation_of(request) if self.conversation_of is not None else None
        directory = self._directory or Path.cwd()
        remembered: Sequence[str] = list(self._allowed)
        if conversation is not None:
            directory = conversation.target.directory
            remembered = await conversation.allowed_always(context)
        rules = self.rules + self._remembered(remembered, directory)
        return rules.decide(request.tool_name, request.args, directory)

    async def __call__(self, request: ToolCallRequest, context: Context) -> Block | None:
        decision = await self.decide(request, context)
        asks = decision.effect == "ask" or (decision.effect is None and request.asks_first
                                              and not self.approve_all)
        if decision.effect == "deny":
            blocked: Block | None = Block(reason=f"a permission rule denies it: {decision.rule}")
        elif asks:
            blocked = await self._asked(request, decision, context)
        else:
            blocked = None
        if self._on_decision is not None:
            asked = asks and (self._ask is not None or self.answered_anywhere)
            self._on_decision(Decided(request, decision, asked=asked, ran=blocked is None))
        return blocked

    async def _asked(self, request: ToolCallRequest, decision: PermissionDecision, context: Context) -> Block | None:
        rule = str(decision.rule) if decision.rule is not None else None
        waits_in = (self.conversation_of(request) if self.answered_anywhere and self.conversation_of is not None
                    else None)
        if self._ask is None and waits_in is None:
            why = f" (the rule {rule} asks)" if rule else ""
            return Block(reason=f"`{request.tool_name}` needs approval{why} and {self._unavailable_reason}")
        asked = ApprovalRequest(operation_id=request.operation_id, tool_call_id=request.tool_call_id,
                                tool_name=request.tool_name, args=dict(request.args),
                                summary=describe_call(request.tool_name, request.args), rule=rule)
        try:
            if waits_in is not None:
                answer = await waits_in.ask_approval(asked, context, here=self._ask)
            else:
                assert self._ask is not None
                answer = await self._ask(asked, context)
        except Exception as error:  # approval fails closed
            return Block(reason=f"the approval check failed ({type(error).__name__}: {error}), so it did not run")
        if context.cancelled:
            return Block(reason="the approval was cancelled")
        if not isinstance(answer, Approval) or not answer.allow:
            reason = answer.reason if isinstance(answer, Approval) and answer.reason else None
            return Block(reason=f"the person declined it: {reason}" if reason else "the person declined it")
        if answer.for_session:
            await self._remember(request, context)
        return None

    async def _remember(self, request: ToolCallRequest, context: Context) -> None:
        """Keep an answer "always" for the call's tool: in its conversation's journal, or here
        when the policy has no conversations (a door's policy serves many: never all of them)."""
        if self.conversation_of is None:
            self._allowed.add(request.tool_name)
            return
        conversation = self.conversation_of(request)
        if conversation is None:
            logger.warning("the answer to allow %s always was not kept: the call's conversation is not known here",
                           request.tool_name)
        elif not await conversation.allow_always(request.tool_name, context):
            # This call runs all the same; the next one asks again, as nothing says otherwise.
            logger.warning("the answer to allow %s always was not kept: the journal refused it", request.tool_name)

    @staticmethod
    def _remembered(texts: Iterable[str], directory: Path) -> PermissionRules:
        rules = []
        for text in texts:
            try:
                rules.append(parse_rule(text, "allow", REMEMBERED_SOURCE, directory))
            except InvalidPermissionRule as error:  # kept by another version: it allows nothing here
                logger.warning("a remembered permission rule is not read: %s", error.message)
        return PermissionRules(rules)


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
