"""The built-in commands a person types in a conversation (`/compact`, `/fast`, `/model`, `/rename`,
`/mode`, `/tools`, `/restart`, `/context`), each built on `ConversationService.run_command` so that every
door records the same row (CE-16, CE-17).

Each takes `(service, user, conversation, args, context)` and `typed`: True when the person typed
it (one `CommandRan` row is recorded), False for a program's call (nothing is). Each returns its
typed outcome; a refusal is a `HarnessError`, recorded with its exact text and raised on.
`fork_conversation` is the store's half of `/fork`, which records no row: its outcome is a new
conversation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

from harness.context import Context
from harness.conversation.chat_events import (
    CommandOutcome,
    CompactOutcome,
    ContextOutcome,
    FastOutcome,
    ModelOutcome,
    ModeOutcome,
    RenameOutcome,
    RestartOutcome,
    ToolsOutcome,
)
from harness.conversation.command_rows import CommandInvocation, compact_outcome, fast_outcome
from harness.conversation.project_context import ProjectContextOff
from harness.conversation.projects import PROJECT_SELECTION
from harness.conversation.recording import CONVERSATION_VALUES, MAIN_LANE
from harness.conversation.service import (
    OWNER,
    BuiltInCommand,
    Conversation,
    ConversationService,
    RecordNow,
    command_of,
)
from harness.conversation.settings import BUILD_TOOLS, TOOLS_CHOSEN, ConversationSettings
from harness.errors import HarnessError, InvalidInput
from harness.messages import THINKING_LEVELS, ModelIdentity, ThinkingLevel
from harness.runtime import NothingToCompact, Settled
from harness.runtime.agent_tool import TOOL_PATTERN_SUFFIX
from harness.session import CompactionPayload, ValueAddress, addresses

Outcome = TypeVar("Outcome", bound=CommandOutcome)


class NoFastModel(HarnessError):
    """`/fast` was asked for, but the service's setup names no fast model; nothing changed."""

    code = "no_fast_model"


class FastBefore(BaseModel):
    """The model and reasoning level `/fast` switched away from, to switch back to."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: ModelIdentity
    thinking_level: ThinkingLevel


FAST_BEFORE = addresses.value_address(CONVERSATION_VALUES.namespace, "fast_before", FastBefore)
"""Present while fast mode is on: what `/fast` again restores. A session value, so fast mode
survives a restart and a restore from the journal."""


def _invocation(name: str, args: str | None, typed: bool) -> CommandInvocation | None:
    return CommandInvocation(name=name, args=args or None) if typed else None


def _itself(outcome: Outcome) -> Outcome:
    return outcome


async def compact(service: ConversationService, user: str, conversation: Conversation, args: str | None,
                  context: Context, *, typed: bool = True) -> CompactOutcome:
    """`/compact [instructions]`: summarize the older part of the conversation (`args` steer the
    summary). Nothing old enough, a failed or a stopped compaction are outcomes, not errors. The
    row is recorded after the compaction entry, so the model reads that it happened (CE-17).
    Raises `LaneBusy` while a turn runs."""

    async def run(record_now: RecordNow) -> CompactOutcome:
        lane = conversation._lane
        before = lane.tip_id
        try:
            outcome = await lane.compact(context, custom_instructions=args or None)
        except NothingToCompact as refused:
            return compact_outcome(refused, None)
        assert isinstance(outcome, Settled)  # a summary never defers, and `compact` waits out its retries
        tip = outcome.result.tip_id
        written = None
        if tip is not None and tip != before:
            entry = await conversation.journal.entry(tip, context)
            written = entry.payload if entry is not None and isinstance(entry.payload, CompactionPayload) else None
        return compact_outcome(outcome.result, written)

    return await service.run_command(user, conversation, _invocation("compact", args, typed), run, _itself, context)


async def fast(service: ConversationService, user: str, conversation: Conversation, args: str | None,
               context: Context, *, typed: bool = True) -> FastOutcome:
    """`/fast`: switch the next turns to the setup's `fast_model` at its `fast_thinking_level` (or
    the current level if that is lower), remembering what was set in `FAST_BEFORE`; `/fast` again
    switches back to it. Applied under the turn lock, between turns. Raises `NoFastModel` when
    none is configured, `ModelUnavailable` or `MissingApiKey` when it cannot run here, and
    `LaneBusy` while a turn runs; nothing changed then."""

    async def run(record_now: RecordNow) -> FastOutcome:
        async with conversation._between_turns(context) as settings:
            harness, lane = settings.harness, settings.lane
            before = await harness.session.get(FAST_BEFORE, context)
            if before is not None:
                # Configure first, forget last: a crash between them leaves fast mode on, and `/fast` again finishes.
                await lane.set_model(before.model, context)
                await lane.set_thinking_level(before.thinking_level, context)
                await harness.set_value(FAST_BEFORE, None, context)
                return fast_outcome(False, lane.config)
            target = service.setup.fast_model
            if target is None:
                raise NoFastModel("no fast model is configured for this conversation")
            settings.check_model(target)
            config = lane.config
            level = min(config.thinking_level, service.setup.fast_thinking_level, key=THINKING_LEVELS.index)
            # Remember first: a crash after it leaves fast mode remembered, and `/fast` switches back.
            await harness.set_value(FAST_BEFORE, FastBefore(model=config.model, thinking_level=config.thinking_level),
                                    context)
            await lane.set_model(target, context)
            await lane.set_thinking_level(level, context)
            return fast_outcome(True, lane.config)

    return await service.run_command(user, conversation, _invocation("fast", args, typed), run, _itself, context)


async def model(service: ConversationService, user: str, conversation: Conversation, args: str | None,
                context: Context, *, typed: bool = True) -> ModelOutcome:
    """`/model provider/id`: the model of the next turns (the id may contain `/`), switched as
    every switch is (`Conversation.switch_model`, CE-12): at once between turns, the command's
    row its one record (naming the tools the switch gave, when they follow the model); behind a
    running turn, the command's row recorded at once saying it is queued, and the switch's own
    `model` row when it lands. Raises `InvalidInput` for anything
    but `provider/id`, `ModelUnavailable` or `MissingApiKey` when the model cannot run here,
    before anything changed."""

    async def run(record_now: RecordNow) -> ModelOutcome:
        identity = ModelIdentity.parse((args or "").strip())
        settings = conversation._settings
        settings.check_model(identity)
        queued = settings.would_queue()
        if queued:
            await record_now(ModelOutcome(model=identity, queued=True))
        switch = await conversation.switch_model(identity, context, recorded_by_command=typed and not queued)
        return ModelOutcome(model=identity, queued=switch.queued, tools=switch.tools)

    return await service.run_command(user, conversation, _invocation("model", args, typed), run, _itself, context)


async def rename(service: ConversationService, user: str, conversation: Conversation, args: str | None,
                 context: Context, *, typed: bool = True) -> RenameOutcome:
    """`/rename NAME`: name the conversation. The command's row is the rename's one record (CE-6):
    no separate `Renamed` row. Raises `InvalidInput` without a name (the rename route clears
    one); nothing changed then."""

    async def run(record_now: RecordNow) -> RenameOutcome:
        name = (args or "").strip()
        if not name:
            raise InvalidInput("/rename needs the new name: /rename NAME")
        await conversation._harness.set_session_name(name, context)
        return RenameOutcome(name=name)

    return await service.run_command(user, conversation, _invocation("rename", args, typed), run, _itself, context)


_MODES: dict[str, Literal["build", "plan"]] = {"build": "build", "plan": "plan"}


async def mode(service: ConversationService, user: str, conversation: Conversation, args: str | None,
               context: Context, *, typed: bool = True) -> ModeOutcome:
    """`/mode build|plan`: the tools of the next turns (`ConversationSettings.apply_mode`: build
    the tools the conversation was configured with, plan the read-only ones among them); its
    command row is the mode's record. Raises `InvalidInput` for another mode; nothing changed then."""

    async def run(record_now: RecordNow) -> ModeOutcome:
        typed_mode = (args or "").strip()
        chosen = _MODES.get(typed_mode)
        if chosen is None:
            raise InvalidInput(f"a mode is build or plan, not {typed_mode!r}", mode=typed_mode)
        await conversation._settings.apply_mode(chosen, context)
        return ModeOutcome(mode=chosen)

    return await service.run_command(user, conversation, _invocation("mode", args, typed), run, _itself, context)


TOOLS_USAGE = "/tools [on|off|auto|±NAME]"


def tools_to_add(names: list[str]) -> str:
    """`names`, tools that are available but off, and how to turn one on, as `/tools` says it: e.g.
    `tools off: project (/tools +project turns it on)`, so that a tool name is not read as a word
    of the sentence."""
    if len(names) == 1:
        return f"tools off: {names[0]} (/tools +{names[0]} turns it on)"
    return f"tools off: {', '.join(names)} (/tools +NAME turns one on)"


async def tools(service: ConversationService, user: str, conversation: Conversation, args: str | None,
                context: Context, *, typed: bool = True) -> ToolsOutcome:
    """`/tools [on | off | auto | +NAME -NAME ...]`: without arguments, the conversation's tools;
    else they change from the running turn's next step (`ConversationSettings.choose_tools`; in
    plan mode the ones build mode gives back). `on` gives the default tools, `off` none, `+NAME`
    and `-NAME` add and remove one: each a choice a model switch keeps; `auto` gives them back
    to the model. Its command row is the change's record. Raises `InvalidInput` for other
    arguments, a name the conversation has no tool of, or `on` and `auto` where the door names
    no default tools (`ConversationSetup.model_tools`); nothing changed then."""

    async def run(record_now: RecordNow) -> ToolsOutcome:
        settings = conversation._settings
        options = settings.harness.options
        # Patterns among the default tools (`mcp__*`) stand for tools that join while it runs.
        patterns = [name for name in (settings.model_tools.default if settings.model_tools else ())
                    if name.endswith(TOOL_PATTERN_SUFFIX)]
        available = list(dict.fromkeys([*(tool.name for tool in options.tools), *sorted(options.live_tools),
                                        *patterns]))
        words = (args or "").split()
        if words:
            await settings.choose_tools(_chosen_tools(settings, words, await settings.configured_tools(context),
                                                      available), context)
        return ToolsOutcome(tools=await settings.configured_tools(context),
                            chosen=await settings.tools_chosen(context), available=available)

    return await service.run_command(user, conversation, _invocation("tools", args, typed), run, _itself, context)


def _chosen_tools(settings: ConversationSettings, words: list[str], current: list[str],
                  available: list[str]) -> list[str] | None:
    """The tools `/tools words` chooses (None: the model's again), from `current` and the
    `available` ones; raises `InvalidInput` as `tools` says."""
    if words in (["on"], ["auto"]):
        if settings.model_tools is None:
            raise InvalidInput("this conversation has no default tools" + (f"; {tools_to_add(available)}"
                                                                            if available else ""), argument=words[0])
        return list(settings.model_tools.default) if words == ["on"] else None
    if words == ["off"]:
        return []
    if not all(len(word) > 1 and word[0] in "+-" for word in words):
        raise InvalidInput(f"/tools takes on, off, auto, or +NAME and -NAME, not {' '.join(words)!r} "
                           f"(usage: {TOOLS_USAGE})", argument=" ".join(words))
    chosen = list(current)
    for word in words:
        name = word[1:]
        if name not in available:
            raise InvalidInput(f"this conversation has no tool {name!r}; its tools are {', '.join(available)}",
                               tool=name)
        if word[0] == "+" and name not in chosen:
            chosen.append(name)
        elif word[0] == "-" and name in chosen:
            chosen.remove(name)
    return chosen


async def restart(service: ConversationService, user: str, conversation: Conversation, args: str | None,
                  context: Context, *, typed: bool = True) -> RestartOutcome:
    """`/restart`: dispose the live conversation and reopen it from its journal; `service.open`
    then gives the reopened one (whose `open_operations` list what a running turn left open). The
    row is recorded before the restart, so it is durable whatever the restart does."""

    async def run(record_now: RecordNow) -> RestartOutcome:
        outcome = RestartOutcome()
        await record_now(outcome)
        await service.close(user, conversation.id, context)
        await service.open(user, conversation.id, context)
        return outcome

    return await service.run_command(user, conversation, _invocation("restart", args, typed), run, _itself, context)


async def show_context(service: ConversationService, user: str, conversation: Conversation, args: str | None,
                       context: Context, *, typed: bool = True) -> ContextOutcome:
    """`/context`: the project instruction files the next turn reads (`ContextOutcome`: each
    one's path, sha256, size and bytes included, root first), the limit on their bytes, and
    whether the model reads exactly these already. Reads the files; changes nothing. Raises
    `ProjectContextOff` when the service reads no project context."""

    async def run(record_now: RecordNow) -> ContextOutcome:
        settings = conversation._settings
        limit, read = settings.project_context_limit(), await settings.read_project_context(context)
        if limit is None or read is None or settings.project is None:
            raise ProjectContextOff("this conversation reads no project context (AGENTS.md, CLAUDE.md)")
        return ContextOutcome(files=read.files, limit_bytes=limit, current=read.files == settings.project.current.files)

    return await service.run_command(user, conversation, _invocation("context", args, typed), run, _itself, context)


FORK_VALUES: tuple[ValueAddress[Any], ...] = (PROJECT_SELECTION, BUILD_TOOLS, FAST_BEFORE, TOOLS_CHOSEN)
"""What a fork carries of its conversation's own values beside the branch and the lane's
configuration, which the store copies: the project its tools run in (CE-19), plan mode's build
set, fast mode's way back and whether the person chose its tools, so the fork runs as the
conversation does now. Not its end (a fork
is live); its owner is the user who forks it."""


async def fork_conversation(service: ConversationService, user: str, conversation_id: str, entry_id: str,
                            context: Context, *, lane: str = MAIN_LANE) -> str:
    """A new conversation of `user` holding their conversation's branch from its root to
    `entry_id`, its lane `lane` idle at that entry with the conversation's configuration and
    `FORK_VALUES` as they are now, named `<name> (fork)` when the source has a name, all in one
    transaction (`Store.fork_session`); returns its id.
    The source may be live, cold or ended and is left as it is. Raises `SessionNotFound`,
    `Forbidden` (another user's conversation) and `UnknownEntry`; nothing was written then."""
    await service.is_open(user, conversation_id, context)  # the owner check; an ended one forks too
    source = await service.store.open_session(conversation_id, context)
    values: list[tuple[ValueAddress[Any], Any]] = [(OWNER, user)]
    if (name := await source.get(addresses.session_name(), context)) is not None:
        values.append((addresses.session_name(), f"{name} (fork)"))
    for address in FORK_VALUES:
        if (record := await source.get_record(address, context)) is not None:
            values.append((address, record.value))
    forked = await service.store.fork_session(conversation_id, entry_id, context, lane=lane, values=values)
    return forked.id


@dataclass(frozen=True)
class DescribedCommand:
    """A built-in command with the words every door shows for it: `usage` as it is typed
    (`/name ARGS`) and a one-line `summary` of what it does, read by the terminal's `/help` and
    Tab menu and by `GET /api/commands` (the page's command list). Called, it runs `run`."""

    usage: str
    summary: str
    run: BuiltInCommand

    async def __call__(self, service: ConversationService, user: str, conversation: Conversation, args: str | None,
                       context: Context, *, typed: bool = True) -> CommandOutcome:
        return await self.run(service, user, conversation, args, context, typed=typed)


BUILT_IN_COMMANDS: dict[str, DescribedCommand] = {
    "compact": DescribedCommand("/compact [instructions]", "summarize the older part of the conversation", compact),
    "fast": DescribedCommand("/fast", "switch the next turns to the fast model at a lower reasoning level, or back",
                             fast),
    "model": DescribedCommand("/model provider/id", "switch the model of the next turns", model),
    "rename": DescribedCommand("/rename NAME", "name the conversation", rename),
    "mode": DescribedCommand("/mode build|plan", "switch to build mode (every tool) or plan mode (the read-only "
                             "ones)", mode),
    "tools": DescribedCommand(TOOLS_USAGE, "list the tools, or change them: on, off, +NAME, -NAME (a model switch "
                              "keeps your choice), auto (the model's again)", tools),
    "restart": DescribedCommand("/restart", "reopen the conversation from its journal", restart),
    "context": DescribedCommand("/context", "list the project's AGENTS.md / CLAUDE.md files the model reads",
                                show_context)}
"""Every built-in command by the name a person types after `/`, in the order a list of them shows."""


async def run_typed_command(service: ConversationService, user: str, conversation: Conversation, line: str,
                            context: Context, *,
                            commands: Mapping[str, BuiltInCommand] = BUILT_IN_COMMANDS) -> CommandOutcome:
    """Run the command a person typed as `line` (`/name args`) from `commands` (a layer above may
    add its own, e.g. the garden's `/goal`), recorded (CE-16). Raises `UnknownCommand` (nothing
    recorded) for a name `commands` does not have, and what the command raises."""
    command, args = command_of(line, commands)
    return await command(service, user, conversation, args, context)
