"""How a client is set up: the models it may use, the workspace of the built-in tools, the background
commands and MCP servers its process shares (`process_tools`), the `ConversationSetup` of them all
(`client_setup`) and a conversation of the local account opened with it through
`ConversationService`; plus the checks `harness doctor` runs.

`harness chat`, `run`, `serve` and `worker` use these: each piece is a plain function of its
inputs, with no typer in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import os
import re
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from harness.context import Context
from harness.conversation import (
    BUILT_IN_COMMANDS,
    DEFAULT_AGENTS,
    JOURNAL_DATA_MIGRATIONS,
    MAIN_LANE,
    PROJECTS_FILE,
    Budget,
    Conversation,
    ConversationService,
    ConversationSetup,
    ModelTools,
)
from harness.conversation.agents import DELEGATION_TOOL_NAMES
from harness.conversation.project_context import PROJECT_CONTEXT_BYTES
from harness.conversation.project_switch import PROJECT_TOOL
from harness.errors import HarnessError, InvalidInput, ModelUnavailable
from harness.home import local_user as local_user  # kept here too: the commands import it with the rest
from harness.messages import ModelIdentity, UserMessage, text_of
from harness.providers import (
    EMBEDDED_IDENTITY,
    DoneEvent,
    ErrorEvent,
    MissingApiKey,
    Model,
    ModelRegistry,
    ProviderRequest,
    StreamOptions,
)
from harness.providers.models import BUILTIN_MODELS
from harness.runtime import DriveSettings, Listener, OpenOperation, RunHooks
from harness.session import (
    LaneConfig,
    SessionMutator,
    SessionNotFound,
    SessionOwned,
    Store,
    addresses,
    connect,
    value_address,
)
from harness.tools import (
    BUILTIN_TOOL_NAMES,
    MCP_TOOLS,
    ApprovalPolicy,
    BackgroundJobs,
    McpServers,
    Workspace,
    builtin_tools,
    system_prompt,
)
from harness.tools.workspace import DEFAULT_ENV_DENY

RETRY_DELAY_VARIABLE = "HARNESS_RETRY_DELAY_MS"
SHELL_ENV_ALLOW_VARIABLE = "HARNESS_SHELL_ENV_ALLOW"
SHELL_ENV_DENY_VARIABLE = "HARNESS_SHELL_ENV_DENY"


class NewConversationLane(HarnessError):
    """A lane other than `main` was asked for a new session: a conversation talks to its person on
    lane `main`, which a new one is made with (another lane is a session's own, e.g. a delegated
    child's); details `{lane}`. Nothing was written."""

    code = "new_conversation_lane"


class LaneHasTools(HarnessError):
    """No tools were asked for a lane that already has active tools (a lane's tools are its own
    setting, kept across runs); details `{lane, tools}`. Nothing was written."""

    code = "lane_has_tools"


@dataclass(frozen=True)
class Readiness:
    """Whether a model can be called now. `problem` is None when it can, else why not: a missing
    key, a weights file that is not there, or a server that did not answer."""

    model: Model
    problem: str | None
    server: str | None = None
    """The base URL that was asked, for a model served over HTTP with its key present."""


PROBE_TIMEOUT_S = 2.0


async def check_readiness(registry: ModelRegistry, models: Sequence[Model], *,
                          timeout_s: float = PROBE_TIMEOUT_S) -> list[Readiness]:
    """For each of `models`, in order: its key is set, its `path` (embedded weights) is a file, and
    its server answers an HTTP GET of its base URL within `timeout_s` seconds (any status counts;
    each server is asked once, all at the same time)."""
    import httpx  # here, not at the top: only `harness models` and `doctor` ask servers, not each chat's start

    async def probe(client: httpx.AsyncClient, url: str) -> str | None:
        try:
            await client.get(url)
        except httpx.HTTPError as error:
            return f"no answer from {url} ({type(error).__name__}: {str(error) or 'no detail'})"
        return None

    servers = {url for model in models if registry.api_key(model) is not None or model.api_key_env is None
               if (url := registry.server_url(model)) is not None}
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        answers = dict(zip(servers, await asyncio.gather(*(probe(client, url) for url in servers)), strict=True))
    return [_readiness(registry, model, answers) for model in models]


def _readiness(registry: ModelRegistry, model: Model, answers: dict[str, str | None]) -> Readiness:
    url = registry.server_url(model)
    if model.api_key_env is not None and registry.api_key(model) is None:
        return Readiness(model, f"missing {model.api_key_env}")
    if (missing := _missing_weights(model)) is not None:
        return Readiness(model, missing)
    return Readiness(model, None if url is None else answers[url], url)


def _missing_weights(model: Model) -> str | None:
    if model.path is not None and not Path(model.path).expanduser().is_file():
        return f"no file at {model.path}"
    return None


def tool_workspace(root: Path, home: Path, model: Model | None = None) -> Workspace:
    """The built-in tools' workspace at `root`, keeping full outputs in `home/tool-output`.

    A tool output sent to the model is at most 30,000 characters, and at most as many characters
    as the model has tokens of context (about a quarter of its window), so a small local model is
    not flooded by one `ls -R`. Shell commands run without the variables `DEFAULT_ENV_DENY` names
    and those `HARNESS_SHELL_ENV_DENY` adds, except those `HARNESS_SHELL_ENV_ALLOW` lets through
    (each a list of shell-style name patterns, separated by commas or spaces)."""
    max_chars = 30_000 if model is None else max(1_000, min(30_000, model.context_window))
    return Workspace(root=root, output_dir=home / "tool-output", max_chars=max_chars,
                     env_deny=(*DEFAULT_ENV_DENY, *_patterns(SHELL_ENV_DENY_VARIABLE)),
                     env_allow=_patterns(SHELL_ENV_ALLOW_VARIABLE))


def _patterns(variable: str) -> tuple[str, ...]:
    return tuple(pattern for pattern in re.split(r"[,\s]+", os.environ.get(variable, "")) if pattern)


def offers_tools(identity: ModelIdentity) -> bool:
    """Whether a new lane on `identity` gets the built-in tools unless told otherwise: every model but
    the tiny embedded default, whose tool calls are mostly wrong and whose prompt the six tool
    descriptions make ten times longer (several seconds before the first word on two cores)."""
    return identity != EMBEDDED_IDENTITY


def no_tools_note(config: LaneConfig, *, give: str, switch: str) -> str | None:
    """Why a lane has no tools when that is `offers_tools`'s doing, and the ways out as the
    command at hand says them (the chat's `give="/tools on"`, `run`'s `give="--tools"`; `switch`
    the same for a model switch); else None."""
    if config.active_tools or offers_tools(config.model):
        return None
    return (f"the tiny embedded model is offered no tools: {give} gives them, and so does a switch to a real "
            f"model ({switch})")


def default_tools(home: Path) -> list[str]:
    """The tools a conversation gets unless told otherwise, on a model that `offers_tools`: the
    built-in and delegation tools, the MCP servers' tools (`MCP_TOOLS`), and the project tool where
    `home/projects.toml` lists projects."""
    # The project tool only where projects are listed: elsewhere it would be one more description
    # in every request for a call that can only say there is nothing to switch to.
    return [*BUILTIN_TOOL_NAMES, *([PROJECT_TOOL] if (home / PROJECTS_FILE).exists() else []),
            *DELEGATION_TOOL_NAMES, MCP_TOOLS]


def drive_settings() -> DriveSettings:
    """How a client's runs are driven: `DriveSettings()`, except that the first retry of a
    transient provider failure waits `HARNESS_RETRY_DELAY_MS` milliseconds when that is set (each
    later one twice the one before, as `RetryPolicy` says; 0 retries at once). `InvalidInput`
    when it is not a whole number of milliseconds."""
    drive = DriveSettings()
    delay = os.environ.get(RETRY_DELAY_VARIABLE)
    if delay is None:
        return drive
    if not delay.strip().isdigit():
        raise InvalidInput(f"{RETRY_DELAY_VARIABLE} is a whole number of milliseconds, not {delay!r}",
                           variable=RETRY_DELAY_VARIABLE, value=delay)
    return replace(drive, retry=replace(drive.retry, base_delay_ms=int(delay)))


@contextlib.asynccontextmanager
async def process_tools(cwd: Path, home: Path) -> AsyncIterator[tuple[BackgroundJobs, McpServers]]:
    """The background shell commands and the MCP servers (`McpServers.from_files(cwd, home)`)
    that one process's conversations share, for `client_setup`: the servers start connecting on
    entry, in the background, and on the way out, however it comes, the commands still running
    are ended and the servers stopped."""
    jobs, mcp = BackgroundJobs(), McpServers.from_files(cwd, home)
    mcp.start()
    try:
        yield jobs, mcp
    finally:
        await jobs.close()
        await mcp.close()


def client_setup(registry: ModelRegistry, workspace: Workspace, home: Path, approval: ApprovalPolicy,
                 jobs: BackgroundJobs, *, drive: DriveSettings | None = None,
                 listeners: Sequence[Listener] = (), mcp: McpServers | None = None,
                 budget: Budget | None = None) -> ConversationSetup:
    """What a client's conversations run with: `registry`'s models (its `fast_identity` for
    `/fast`), the built-in tools working in `workspace.root` (or in the conversation's project)
    with `approval` as their `before_tool` hook (for the tools it gates) and background commands
    tracked in `jobs`, projects listed from `home/projects.toml`, and the `general` agent to
    delegate to (CE-18). The terminal and `harness serve` both build theirs here; `drive` defaults
    to `drive_settings()`, `budget` (each run's spending caps, issue 32) to none. The tools of
    `mcp`'s servers join as they connect and change at step boundaries (`McpServers`); a lane
    offers them through `MCP_TOOLS`. Shell commands, the agent's and the person's own (`!cmd`, a
    server's `POST .../shell`), also run without the variable of each of the registry's API keys,
    whatever its name."""
    keys = {row.model.api_key_env for row in registry.configured() if row.model.api_key_env is not None}
    workspace = replace(workspace, env_deny=(*workspace.env_deny, *sorted(keys)))
    return ConversationSetup(
        models=registry, system_prompt=system_prompt(workspace), drive=drive or drive_settings(),
        budget=budget or Budget(), hooks=RunHooks(before_tool=approval, before_tool_applies=approval.decides,
                       between_steps=mcp.at_step_boundary if mcp is not None else None), listeners=listeners,
        live_tools=mcp.tools if mcp is not None else {},
        directory=workspace.root, projects_file=home / PROJECTS_FILE, running_jobs=jobs.running,
        fast_model=registry.fast_identity, commands=BUILT_IN_COMMANDS,
        model_tools=ModelTools(default=default_tools(home), offered=offers_tools),
        tools_for=lambda target: builtin_tools(workspace, directory=lambda: target.directory, jobs=jobs,
                                               owner=target.conversation_id),
        agents=DEFAULT_AGENTS, project_context_bytes=PROJECT_CONTEXT_BYTES, shell_environment=workspace.environment)


def new_lane_config(identity: ModelIdentity, home: Path, tools: bool | None = None) -> LaneConfig:
    """A new lane on `identity`: `default_tools` active when `offers_tools` (or `tools` says so)."""
    offered = offers_tools(identity) if tools is None else tools
    return LaneConfig(model=identity, active_tools=default_tools(home) if offered else [])


@dataclass(frozen=True)
class Attached:
    """A conversation opened live for a terminal client, the lane it works on (`main`, or a side
    lane of the session named with `--lane`), and what the client acts on it through."""

    conversation: Conversation
    lane: str
    model: Model | None
    """The lane's model, resolved; None when it is not usable (see `attach_client`'s `require_model`)."""
    created_session: bool
    service: ConversationService
    """The service the conversation was opened through: commands and `!cmd` rows go through it."""
    user: str

    @property
    def open_operations(self) -> list[OpenOperation]:
        return self.conversation.open_operations


async def attach_client(
    store: Store,
    session_id: str | None,
    context: Context,
    *,
    registry: ModelRegistry,
    home: Path,
    cwd: Path,
    approval: ApprovalPolicy,
    jobs: BackgroundJobs,
    model: ModelIdentity | None = None,
    lane: str = "main",
    listeners: Sequence[Listener] = (),
    mcp: McpServers | None = None,
    drive: DriveSettings | None = None,
    tools: bool | None = None,
    require_model: bool = True,
    user: str | None = None,
    budget: Budget | None = None,
    fallback: Sequence[ModelIdentity] = (),
) -> Attached:
    """Open conversation `session_id` of `user` (default `local_user()`; a new one when None)
    through a `ConversationService`, its harness running the built-in tools in the conversation's
    project, or in `cwd` while it has none, with `approval` as the `before_tool` hook, its
    background shell commands tracked in `jobs`, the tools of `mcp`'s servers, the `general` agent
    to delegate to (CE-18), and
    `/fast` switching to the registry's `fast_identity`: the service's own hooks (turn-end rows,
    the replay of cut replies, the model's project switch, CE-7 to CE-9, CE-19) apply to every
    turn, a sub-agent's too. Projects are listed from `home/projects.toml`. A session without an owner (made before
    conversations had owners, imported, forked, or a chat's saved draft) is adopted by `user`
    first, once; one of another user is `Forbidden`. Close it with `Attached.conversation.dispose`.

    The model is `model` when given (the lane is switched to it), else the lane's configured
    model, else the registry's default (the embedded model when no key is configured). It is
    checked before anything is written: `ModelUnavailable`, `MissingApiKey`. A new lane gets the
    built-in and delegation tools as its active tools (when `offers_tools`; `tools` True or False decides instead;
    `tools=False` raises `LaneHasTools` for an existing lane that has some). Tools nobody chose
    follow the model (`ConversationSetup.model_tools`); `tools` True or False is a choice the
    conversation keeps across model switches, on an existing conversation too (True gives one
    without tools the default ones). A new session is named from its first prompt, as every
    door's (`ConversationSettings.admit`). `drive` defaults to `drive_settings()` (compaction fits itself to the model).
    `budget` caps what each run spends (`Budget`, issue 32); `fallback` are the models that take a
    step over, in order, when the lane's model keeps failing with a retryable error
    (`DriveSettings.fallback`): each must be usable, checked with the model.
    With `require_model=False` a lane whose configured model is not usable is still attached (to
    read it, or switch its model), with `Attached.model` None; a `model` given here must be usable
    all the same. Also raises
    `SessionNotFound` and `SessionOwned` (another process holds the session), and
    `NewConversationLane` for a `lane` other than `main` without a `session_id`."""
    if session_id is None and lane != MAIN_LANE:
        raise NewConversationLane(f"a new session talks on lane {MAIN_LANE}; lane {lane} can only be chosen in an "
                                  "existing session (give its id)", lane=lane)
    user = user if user is not None else local_user()
    configured: LaneConfig | None = None
    if session_id is not None:
        session = await store.open_session(session_id, context)
        configured = await session.get(addresses.lane_config(lane), context)
        if tools is False and configured is not None and configured.active_tools:
            raise LaneHasTools(f"lane {lane} of session {session_id} already has tools "
                               f"({', '.join(configured.active_tools)}); a lane without tools is made when it "
                               f"is created: leave out --no-tools, or start a new session with it",
                               lane=lane, tools=list(configured.active_tools))
    identity = model or (configured.model if configured else registry.default_identity())
    resolved: Model | None = None
    try:
        resolved = registry.usable(identity)
    except (ModelUnavailable, MissingApiKey):
        if require_model or model is not None or configured is None:
            raise
    for each in fallback:
        registry.usable(each)
    if fallback:
        drive = replace(drive or drive_settings(), fallback=tuple(fallback))
    # The setup follows the working directory and the model (the tools' output limit), so each
    # attachment has a service of its own; what conversations share is the journal.
    setup = client_setup(registry, tool_workspace(cwd, home, resolved), home, approval, jobs,
                         drive=drive, listeners=listeners, mcp=mcp, budget=budget)
    service = ConversationService(store, setup)
    config = new_lane_config(identity, home, tools)
    if session_id is None:
        conversation = await service.create(user, config, context, tools_chosen=tools is not None)
    else:
        await service.adopt(user, session_id, context)
        conversation = await service.open(user, session_id, context)
    try:
        await conversation.ensure_lane(lane, config, context)
        if session_id is not None and tools is not None and lane == MAIN_LANE:
            # Chosen before the switch below, which then keeps them (`--model X --no-tools`).
            kept = await conversation.configured_tools(context)
            await conversation.choose_tools(kept or (default_tools(home) if tools else []), context)
        # A switch as every door makes it, recorded (CE-12); nothing runs yet, so it lands now. An
        # ended conversation takes no turn, so it keeps the model it ended on.
        if conversation.config(lane).model != identity and await service.is_open(user, conversation.id, context):
            await conversation.switch_model(identity, context, lane=lane, wait_for_completion=True)
    except BaseException:
        await conversation.dispose(context)
        raise
    return Attached(conversation, lane, resolved, session_id is None, service, user)


# -- doctor ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One line of `harness doctor`: `ok`, `warn` (works, but worth knowing) or `fail`."""

    name: str
    status: Literal["ok", "warn", "fail"]
    detail: str


LEGACY_DOCTOR_SESSION_ID = "harness-doctor"
"""The scratch session earlier versions of `harness doctor` kept in the store; removed when found."""

_DOCTOR_VALUE = value_address("cli.doctor", "last_check")


async def check_store(store_url: str, context: Context) -> list[Check]:
    """Connect to the store as every other command does (applying the journal data migrations,
    CE-25), write a value in a scratch session, read it back and delete the session again, so the
    store holds nothing of doctor's afterwards."""
    try:
        store = await connect(store_url, context, data_migrations=JOURNAL_DATA_MIGRATIONS)
    except HarnessError as error:
        return [Check("store", "fail", f"cannot open {store_url}: {error.message}")]
    checks = [Check("store", "ok", f"connected to {store_url}")]
    try:
        with contextlib.suppress(SessionNotFound, SessionOwned):
            await store.delete_session(LEGACY_DOCTOR_SESSION_ID, context)
        session = await store.create_session(context)
        stamp = time.time_ns()

        async def write(m: SessionMutator) -> None:
            m.set(_DOCTOR_VALUE, stamp)
            m.set(addresses.session_name(), "harness doctor scratch session")

        try:
            await session.mutate(write, context)
            read = await session.get(_DOCTOR_VALUE, context)
        finally:
            await store.delete_session(session.id, context)
        if read != stamp:
            checks.append(Check("store write", "fail", f"wrote {stamp} and read back {read!r}"))
        else:
            checks.append(Check("store write", "ok", "committed and read back a value in a scratch session, "
                                                     "then deleted it"))
    except HarnessError as error:
        checks.append(Check("store write", "fail", f"[{error.code}] {error.message}"))
    finally:
        await store.close(context)
    return checks


def check_models(home: Path) -> tuple[list[Check], ModelRegistry | None]:
    """Parse `home/models.toml` and say which API keys are present."""
    path = home / "models.toml"
    try:
        registry = ModelRegistry.load(home=home)
    except HarnessError as error:
        return [Check("models.toml", "fail", error.message)], None
    rows = registry.configured()
    detail = f"{path} parsed" if path.exists() else f"no {path}; built-in models only"
    checks = [Check("models.toml", "ok", f"{detail} ({len(rows)} models)")]
    keys: dict[str, bool] = {}
    for row in rows:
        if row.model.api_key_env is not None:
            keys[row.model.api_key_env] = keys.get(row.model.api_key_env, False) or row.key_present
    present = sorted(env for env, ok in keys.items() if ok)
    missing = sorted(env for env, ok in keys.items() if not ok)
    status: Literal["ok", "warn"] = "ok" if present else "warn"
    text = f"present: {', '.join(present) or 'none'}; missing: {', '.join(missing) or 'none'}"
    checks.append(Check("api keys", status, text))
    return checks, registry


async def check_model_readiness(registry: ModelRegistry) -> list[Check]:
    """The default model and each model that is not built in (those of `models.toml`) can be
    called: key, weights file, server (see `check_readiness`). A missing key warns; the rest fail."""
    default = registry.default_identity()
    builtin = {(model.provider, model.id) for model in BUILTIN_MODELS}
    declared = [row.model for row in registry.configured()
                if row.identity != default and (row.model.provider, row.model.id) not in builtin]
    checks = []
    for index, found in enumerate(await check_readiness(registry, [registry.model(default), *declared])):
        identity = ModelIdentity(provider=found.model.provider, model_id=found.model.id)
        name, label = ("default model", identity.spec) if index == 0 else (
            f"model {identity.spec}", found.model.api)
        if found.problem is None:
            where = f" at {found.server}, which answers" if found.server else ""
            checks.append(Check(name, "ok", f"{label}{where}"))
        else:
            status: Literal["warn", "fail"] = "warn" if found.problem.startswith("missing ") else "fail"
            checks.append(Check(name, status, f"{label}: {found.problem}"))
    return checks


async def check_embedded(registry: ModelRegistry, context: Context) -> list[Check]:
    """The embedded model: its runtime imports, its weights are there, and it generates."""
    if importlib.util.find_spec("llama_cpp") is None:
        return [Check("embedded runtime", "fail", "llama-cpp-python is not installed")]
    try:
        runtime = await asyncio.to_thread(importlib.import_module, "llama_cpp")
    except Exception as error:  # a broken native build fails here, in many ways
        return [Check("embedded runtime", "fail", f"llama_cpp does not import: {error}")]
    checks = [Check("embedded runtime", "ok", f"llama-cpp-python {getattr(runtime, '__version__', '?')}")]
    model, provider = registry.resolve(EMBEDDED_IDENTITY)
    request = ProviderRequest(messages=(UserMessage(content="What is the capital of France? One word."),))
    options = StreamOptions(temperature=0.0, seed=42, max_tokens=16)
    started = time.monotonic()
    try:
        stream = provider.stream(model, request, options, context)
    except HarnessError as error:  # the weights are looked up before the stream starts
        return [*checks, Check("embedded weights", "fail", error.message)]
    checks.append(Check("embedded weights", "ok", f"{EMBEDDED_IDENTITY.spec} found"))
    final = None
    try:
        async for event in stream:
            if isinstance(event, DoneEvent | ErrorEvent):
                final = event
    except Exception as error:  # the native runtime can fail in ways no adapter classifies
        return [*checks, Check("embedded generation", "fail", f"{type(error).__name__}: {error}")]
    if not isinstance(final, DoneEvent):
        problem = final.error.message if isinstance(final, ErrorEvent) else "the stream ended without a reply"
        return [*checks, Check("embedded generation", "fail", problem)]
    text = text_of(final.message.content).strip()
    if not text:
        return [*checks, Check("embedded generation", "fail", "the reply was empty")]
    elapsed = time.monotonic() - started
    return [*checks, Check("embedded generation", "ok", f"{text[:60]!r} in {elapsed:.1f} s")]
