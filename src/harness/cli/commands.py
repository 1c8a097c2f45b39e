"""The commands of `harness` but the session ones (`session_commands`), registered on the application.

Each command imports what it runs (the chat's terminal, the runtime, the importers, the model
checks) in its body, as every command module does: see `harness.cli.app`."""

from __future__ import annotations

import asyncio
import math
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from harness.cli.app import StoreOption, app, command_group, default_store_url, run_with_store
from harness.cli.session_refs import SessionArgument, latest_session, resolve_session
from harness.context import Context
from harness.errors import HarnessError, InvalidInput
from harness.home import harness_home
from harness.messages import ModelIdentity
from harness.session import Store

if TYPE_CHECKING:
    from harness.cli.config import Readiness
    from harness.conversation import Budget
    from harness.imports import ImportReport
    from harness.providers import Model, ModelRegistry
    from harness.tools import PermissionRules

CHAT_MODULES = ("harness.cli.chat", "harness.cli.chat_commands", "harness.cli.config", "harness.providers",
                "harness.tools")
"""What `harness chat` loads while its first prompt is up (`harness.chat_start`)."""

import_app = command_group("import", "Read another agent's session file into a new session. Prints the new session id.")

ImportFile = Annotated[Path, typer.Argument(metavar="FILE", help="The session file (JSONL) to import.")]

AllowOption = Annotated[list[str] | None, typer.Option(
    "--allow", metavar="RULE", help="A permission rule whose calls run without asking, e.g. 'shell(git status*)' or "
                                    "'write(src/**)' (repeatable; beside the settings files' rules).")]
DenyOption = Annotated[list[str] | None, typer.Option(
    "--deny", metavar="RULE", help="A permission rule whose calls never run, e.g. 'shell(rm *)' (repeatable; deny "
                                   "beats ask and allow).")]
BudgetTokensOption = Annotated[int | None, typer.Option(
    "--budget-tokens", metavar="N", min=1, help="Stop a run once it has used N tokens (checked before each "
                                                  "request; its sub-agents' count too).")]
BudgetUsdOption = Annotated[float | None, typer.Option(
    "--budget-usd", metavar="X", help="Stop a run once it has cost X US dollars at the models' prices.")]
ModelOption = Annotated[str | None, typer.Option(
    "--model", metavar="MODEL", help="provider/id, e.g. openai/gpt-4o (default: the lane's model, else models.toml's "
                                     "default, else a model the OPENAI_BASE_URL server lists, else the first "
                                     "built-in model whose API key is set, else embedded/smollm2-135m; `harness "
                                     "models` shows which).")]
"""`--model` of `chat` and `run`: one default, said once (`providers.models` chooses it)."""
FallbackOption = Annotated[list[str] | None, typer.Option(
    "--fallback", metavar="MODEL", help="A provider/id that takes a request over when the model still fails with "
                                        "a retryable error after its retries (repeatable, tried in order).")]


def spending(budget_tokens: int | None, budget_usd: float | None,
             fallback: list[str] | None) -> tuple[Budget, tuple[ModelIdentity, ...]]:
    """Each run's caps and the fallback models of `--budget-tokens`, `--budget-usd` and
    `--fallback` (issue 32), checked by `checked_fallback`."""
    models = checked_fallback(budget_usd, fallback)
    from harness.conversation import Budget

    return Budget(run_tokens=budget_tokens, run_usd=budget_usd), models


def checked_fallback(budget_usd: float | None, fallback: list[str] | None) -> tuple[ModelIdentity, ...]:
    """The fallback models of `--fallback`; a dollar amount that is not a positive number or a
    model that is not provider/id is a usage error (exit status 2) before anything is opened or
    loaded."""
    if budget_usd is not None and not (math.isfinite(budget_usd) and budget_usd > 0):
        raise typer.BadParameter(f"a budget is a positive number of US dollars, not {budget_usd}",
                                 param_hint="--budget-usd")
    try:
        models = tuple(ModelIdentity.parse(each) for each in fallback or ())
    except InvalidInput as error:
        raise typer.BadParameter(error.message, param_hint="--fallback") from error
    return models


def permission_rules(home: Path, cwd: Path, allow: list[str] | None, deny: list[str] | None) -> PermissionRules:
    """The rules of `--allow` and `--deny`, the project's settings and the user's (issue 30); a
    bad rule or settings file is a usage error (exit status 2) before anything is opened."""
    from harness.tools import load_permission_rules

    try:
        return load_permission_rules(home, cwd, allow=allow or (), deny=deny or ())
    except HarnessError as error:
        typer.echo(f"error [{error.code}]: {error.message}", err=True)
        raise typer.Exit(2) from error


@app.command()
def chat(
    ctx: typer.Context,
    session: Annotated[str | None, typer.Argument(
        metavar="SESSION", help="The session to continue (an id, a unique id prefix or its name); a new one when "
                                  "omitted.")] = None,
    continue_last: Annotated[bool, typer.Option(
        "--continue", "-c", help="Continue the most recently updated session.")] = False,
    lane: Annotated[str, typer.Option(
        metavar="LANE", help="The lane of an existing session to chat on (a new session talks on main).")] = "main",
    model: ModelOption = None,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Finish a turn that a stopped process left open, without asking.")] = False,
    yes: Annotated[bool, typer.Option(
        "--yes", "-y", help="Allow write, edit and shell calls for this chat without asking.")] = False,
    tools: Annotated[bool, typer.Option(
        "--tools", help="Give a new lane the built-in tools even on the tiny embedded model, which gets none by "
                        "default.")] = False,
    allow: AllowOption = None,
    deny: DenyOption = None,
    budget_tokens: BudgetTokensOption = None,
    budget_usd: BudgetUsdOption = None,
    fallback: FallbackOption = None,
    store: StoreOption = None,
) -> None:
    """Chat with an agent in the terminal. Every turn is journaled, so a stopped chat can be resumed."""
    checked_fallback(budget_usd, fallback)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        typer.echo("harness chat needs a terminal; for one prompt from a script use `harness run`", err=True)
        raise typer.Exit(2)

    if continue_last and session is not None:
        raise typer.BadParameter("give a SESSION or --continue, not both", param_hint="--continue")
    budget, fallback_models = spending(budget_tokens, budget_usd, fallback)
    from harness.cli.chat import ChatClient, ChatSettings
    from harness.cli.chat_commands import COMMANDS
    from harness.cli.config import NewConversationLane
    from harness.providers import ModelRegistry

    home, cwd = harness_home(), Path.cwd()
    rules = permission_rules(home, cwd, allow, deny)

    async def body(s: Store, context: Context) -> int:
        session_id = (await latest_session(s, context) if continue_last
                      else await resolve_session(s, session, context) if session is not None else None)
        settings = ChatSettings(home=home, cwd=cwd, session_id=session_id, lane=lane,
                                model=ModelIdentity.parse(model) if model else None, approve_all=yes, resume=resume,
                                tools=True if tools else None, rules=rules, budget=budget,
                                fallback=fallback_models)
        registry = ModelRegistry.load(home=settings.home)
        client = ChatClient(s, settings, registry, context, commands=COMMANDS, out=sys.stdout,
                            color="NO_COLOR" not in os.environ)
        client.terminal.give_back(ctx.obj or "")  # typed at the first prompt (`harness.cli.main`)
        try:
            return await client.run()
        except NewConversationLane as error:
            raise typer.BadParameter(error.message, param_hint="--lane") from error

    raise typer.Exit(run_with_store(store, body))


@app.command()
def show(session_id: SessionArgument,
         lane: Annotated[str, typer.Option(metavar="LANE", help="The lane to print.")] = "main",
         full: Annotated[bool, typer.Option("--full", help="Print every text whole; without it, texts longer "
                                                          "than 400 characters are cut.")] = False,
         store: StoreOption = None) -> None:
    """Print a session's branch readably, oldest first."""
    from harness.cli.render import SHOW_LIMIT, print_branch

    async def body(s: Store, context: Context) -> None:
        session = await s.open_session(await resolve_session(s, session_id, context), context)
        await print_branch(session, lane, context, limit=None if full else SHOW_LIMIT)

    run_with_store(store, body)


@app.command()
def run(
    prompt: Annotated[str | None, typer.Argument(
        metavar="PROMPT", help="What to ask; - reads it from stdin. Optional with --resume.")] = None,
    session: Annotated[str | None, typer.Option(
        "--session", metavar="SESSION", help="Continue this session (default: a new one).")] = None,
    model: ModelOption = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Allow write, edit and shell calls; without it they "
                                                           "are refused, since nobody can be asked.")] = False,
    json_events: Annotated[bool, typer.Option("--json", help="Print JSON lines on stdout: first "
                                                             '{"type": "session", "session_id": ..., "lane": ...}, '
                                                             "then every event.")]
    = False,
    no_tools: Annotated[bool, typer.Option("--no-tools", help="Give a new lane no tools: the model answers in "
                                                               "text (refused for a lane that has tools).")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="Finish the operation left open on the lane (with "
                                                          "--session), then send the prompt if one is given.")]
    = False,
    offer_tools: Annotated[bool, typer.Option("--tools", help="Give a new lane the built-in tools even on the tiny "
                                                               "embedded model, which gets none by default.")] = False,
    lane: Annotated[str, typer.Option(
        metavar="LANE", help="The lane of the session to run on (with --session; a new session talks on "
                             "main).")] = "main",
    allow: AllowOption = None,
    deny: DenyOption = None,
    output_schema: Annotated[Path | None, typer.Option(
        "--output-schema", metavar="FILE", help="A JSON Schema file: the answer must be JSON of that shape (sent "
                                                "back to the model while it is not, at most twice); stdout then "
                                                "holds only that JSON.")] = None,
    budget_tokens: BudgetTokensOption = None,
    budget_usd: BudgetUsdOption = None,
    fallback: FallbackOption = None,
    store: StoreOption = None,
) -> None:
    """Run one turn without a terminal and stream its reply. Tools work in the current directory.

    Exit status: 0 completed, 1 failed (or an error before the run), 2 a usage error, 3 deferred by
    the provider, 4 aborted (Ctrl-C, an abort from elsewhere, or its budget reached); 130 when a
    second Ctrl-C left without waiting (the run stays open: --resume finishes it)."""
    if resume and session is None:
        raise typer.BadParameter("--resume needs --session: a new session has nothing to resume",
                                 param_hint="--resume")
    if prompt is None and not resume:
        raise typer.BadParameter("a prompt is needed (or --resume with --session)", param_hint="PROMPT")
    from harness.cli.config import LaneHasTools, NewConversationLane
    from harness.cli.run import EXIT_INTERRUPTED, RunTurn, read_output_schema, run_turn
    from harness.providers import ModelRegistry
    from harness.runtime.requests import MAX_INPUT_BYTES

    # One character past the bound is enough for the run to be refused (prompt_too_large): a pipe
    # of gigabytes is not read whole first.
    text = sys.stdin.read(MAX_INPUT_BYTES + 1) if prompt == "-" else prompt
    if text is not None and not text.strip():
        raise typer.BadParameter("the prompt is empty", param_hint="PROMPT")
    try:
        identity = ModelIdentity.parse(model) if model is not None else None
    except InvalidInput as error:
        raise typer.BadParameter(error.message, param_hint="--model") from error
    try:
        output = read_output_schema(output_schema) if output_schema is not None else None
    except InvalidInput as error:
        raise typer.BadParameter(error.message, param_hint="--output-schema") from error
    budget, fallback_models = spending(budget_tokens, budget_usd, fallback)
    home, cwd = harness_home(), Path.cwd()
    turn = RunTurn(prompt=text, cwd=cwd, home=home, session_id=session, lane=lane, model=identity,
                   approve_all=yes, json_events=json_events, resume=resume,
                   tools=False if no_tools else True if offer_tools else None,
                   rules=permission_rules(home, cwd, allow, deny), output=output, budget=budget,
                   fallback=fallback_models)

    async def body(s: Store, context: Context) -> int:
        registry = ModelRegistry.load(home=turn.home)
        resolved = turn
        if turn.session_id is not None:
            resolved = replace(turn, session_id=await resolve_session(s, turn.session_id, context))
        try:
            return await run_turn(s, resolved, registry, context)
        except LaneHasTools as error:
            raise typer.BadParameter(error.message, param_hint="--no-tools") from error
        except NewConversationLane as error:
            raise typer.BadParameter(error.message, param_hint="--lane") from error

    try:
        code = run_with_store(store, body)
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_INTERRUPTED) from None
    raise typer.Exit(code)


@app.command()
def models() -> None:
    """List the models and whether each can be called. The configured ones show provider/id, api,
    context window and what a call needs (its key, its weights file, its server answering); then
    come the models each OpenAI-compatible server other than OpenAI's lists (its /models); `*`
    marks the default."""
    from harness.cli.config import check_readiness
    from harness.providers import ModelRegistry

    home = harness_home()
    try:
        registry = ModelRegistry.load(home=home)
    except HarnessError as error:
        typer.echo(f"error [{error.code}]: {error.message}", err=True)
        raise typer.Exit(1) from error
    path = home / "models.toml"
    typer.echo(f"# {path}" + ("" if path.exists() else " (not found: built-in models only)"))
    default: ModelIdentity | None = None
    try:
        default = registry.default_identity()
    except HarnessError as error:
        typer.echo(f"# no default model: {error.message}")
    rows = registry.configured()
    found = asyncio.run(check_readiness(registry, [row.model for row in rows]))
    width = max(len(row.identity.spec) for row in rows)
    for row, ready in zip(rows, found, strict=True):
        mark = "*" if row.identity == default else " "
        state = ready.problem or ("ready" if row.model.api_key_env is None else f"key {row.model.api_key_env}")
        typer.echo(f"{mark} {row.identity.spec:<{width}}  {row.model.api:<18} "
                   f"{row.model.context_window:>9,}  {state}")
    for url, model in _compatible_servers(registry, [ready for ready in found if ready.problem is None]).items():
        try:
            served = [ModelIdentity(provider=model.provider, model_id=model_id)
                      for model_id in registry.served_models(model)]
        except HarnessError as error:
            typer.echo(f"# {url}: {error.message}")
            continue
        typer.echo(f"# served at {url} ({len(served)} models)")
        for identity in served:
            typer.echo(f"{'*' if identity == default else ' '} {identity.spec}")
    typer.echo("# other model ids of openai, anthropic and the providers of models.toml work with default limits")


def _compatible_servers(registry: ModelRegistry, ready: list[Readiness]) -> dict[str, Model]:
    """One callable model per OpenAI-compatible server that is not OpenAI's own (whose list is its
    whole catalogue), by base URL, in the order of `ready`."""
    servers: dict[str, Model] = {}
    for found in ready:
        url = registry.server_url(found.model)
        if url is not None and found.model.api in ("openai-chat", "openai-responses") and "api.openai.com" not in url:
            servers.setdefault(url, found.model)
    return servers


@app.command()
def doctor(store: StoreOption = None) -> None:
    """Check that the store, the models and the MCP servers work. The store: connect, a write in a
    scratch session; the models configuration: the default model and each model of models.toml can
    be called (key, weights file, server); the embedded model; each MCP server: it starts and
    lists its tools. One line per check, exit status 1 if any failed."""
    from harness.cli.config import Check, check_embedded, check_model_readiness, check_models, check_store
    from harness.cli.mcp_commands import check_mcp_servers
    from harness.providers import ModelRegistry

    home = harness_home()

    async def checks() -> bool:
        context = Context({"cli": True, "doctor": True})
        failed = False

        def report(found: list[Check]) -> None:
            nonlocal failed
            for check in found:
                typer.echo(f"{check.status:<4}  {check.name}: {check.detail}")
                failed = failed or check.status == "fail"

        report(await check_store(store or default_store_url(), context))
        model_checks, registry = check_models(home)
        report(model_checks)
        if registry is not None:
            report(await check_model_readiness(registry))
        report(await check_embedded(registry or ModelRegistry(), context))
        report(await check_mcp_servers(Path.cwd(), home))
        return failed

    raise typer.Exit(1 if asyncio.run(checks()) else 0)


class ExportUnwritable(HarnessError):
    """The export's output file cannot be created (a missing folder, no permission)."""

    code = "export_unwritable"


@app.command("export")
def export_session(
    session_id: SessionArgument,
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", metavar="FILE", help="Write to this file (default: stdout).")] = None,
    store: StoreOption = None,
) -> None:
    """Write a session as harness JSONL. `harness import harness FILE` reads it back."""
    from harness.imports import export_harness_session

    async def body(s: Store, context: Context) -> None:
        session = await s.open_session(await resolve_session(s, session_id, context), context)
        if output is None:
            report = await export_harness_session(session, sys.stdout, context)
            sys.stdout.flush()
        else:
            try:
                file = output.open("w", encoding="utf-8")
            except OSError as error:
                raise ExportUnwritable(f"cannot write {output}: {error.strerror}", path=str(output)) from error
            with file:
                report = await export_harness_session(session, file, context)
        counts = [_counted(report.entries, "entry", "entries"), _counted(report.lanes, "lane"),
                  _counted(report.labels, "label"), _counted(report.usage_rows, "usage row")]
        typer.echo(f"exported {', '.join(counts)}", err=True)
        for warning in report.warnings:
            typer.echo(f"warning: {warning}", err=True)

    run_with_store(store, body)


def _counted(count: int, one: str, many: str | None = None) -> str:
    """`1 lane`, `2 lanes`: a count with its noun, plural unless the count is one."""
    return f"{count} {one if count == 1 else many or one + 's'}"


@import_app.command("harness")
def import_harness(file: ImportFile, store: StoreOption = None) -> None:
    """Import a file of `harness export`. It becomes a conversation of the local account."""
    from harness.imports import import_harness_session

    _import(store, lambda s, context, user: import_harness_session(s, file, user, context))


@import_app.command("pi")
def import_pi(file: ImportFile, store: StoreOption = None) -> None:
    """Import a pi coding-agent session file (format v1, v2 or v3). It becomes a conversation of
    the local account."""
    from harness.imports import import_pi_session

    _import(store, lambda s, context, user: import_pi_session(s, file, user, context))


@import_app.command("claude-code")
def import_claude_code(file: ImportFile, store: StoreOption = None) -> None:
    """Import a Claude Code session transcript. It becomes a conversation of the local account."""
    from harness.imports import import_claude_code_session

    _import(store, lambda s, context, user: import_claude_code_session(s, file, user, context))


def _import(store: str | None, run: Callable[[Store, Context, str], Awaitable[ImportReport]]) -> None:
    """Run one import as the local user: the new session id on stdout (for scripts), what was
    read on stderr."""
    from harness.cli.config import local_user

    async def body(s: Store, context: Context) -> None:
        report = await run(s, context, local_user())
        typer.echo(report.session_id)
        unanswered = f" ({report.unanswered_tool_calls} unanswered)" if report.unanswered_tool_calls else ""
        typer.echo(f"imported {report.source_format}: {report.messages} messages, {report.tool_calls} tool "
                   f"calls{unanswered}, {report.compactions} compactions, {report.entries} entries", err=True)
        if report.skipped:
            skipped = ", ".join(f"{count} {kind}" for kind, count in report.skipped.items())
            typer.echo(f"skipped: {skipped}", err=True)
        for warning in report.warnings:
            typer.echo(f"warning: {warning}", err=True)

    run_with_store(store, body)
