"""The REST routes of every conversation door: conversations, turns, commands, approvals, the
display read and images. Each goes through the one `ConversationService` of the server, as the
current user; another user's conversation answers exactly like a missing one (404)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated

from fastapi import APIRouter, Query, Response, status
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from harness.context import Context
from harness.conversation import (
    BUILT_IN_COMMANDS,
    MAIN_LANE,
    BuiltInCommand,
    CommandOutcome,
    CompactOutcome,
    Conversation,
    ConversationInfo,
    ConversationService,
    DirectoryMoved,
    DisplayPage,
    FastOutcome,
    ModelSwitch,
    PendingApproval,
    PostedCommand,
    SwitchableProject,
    compact,
    fast,
)
from harness.conversation.display import DISPLAY_PAGE, MAX_DISPLAY_PAGE
from harness.errors import InvalidInput
from harness.messages import ImageContent, ModelIdentity, OutputSchema, Usage
from harness.runtime import LaneBusy
from harness.server.errors import ExternalModeUnsupported
from harness.server.guards import NAME_CHARS, TEXT_CHARS, ShellCommand
from harness.server.state import CurrentUser, RequestContext, State
from harness.session import StorageCorruption, StoredImage, addresses
from harness.tools import Approval

router = APIRouter(prefix="/api", tags=["conversations"])


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ConversationOut(BaseModel):
    """A conversation as a listing shows it; times are Unix ms."""

    id: str
    name: str | None
    created_at: int
    updated_at: int

    @classmethod
    def of(cls, info: ConversationInfo) -> ConversationOut:
        return cls(id=info.id, name=info.name, created_at=info.created_at, updated_at=info.updated_at)


class CreateConversation(_Body):
    name: str | None = Field(default=None, max_length=NAME_CHARS, description="The conversation's name; none: unnamed.")
    model: ModelIdentity | None = Field(default=None, description="Its model; none: the server's default.")


@router.post("/conversations", status_code=status.HTTP_201_CREATED, response_model=ConversationOut)
async def create_conversation(body: CreateConversation, user: CurrentUser, state: State,
                              context: RequestContext) -> ConversationOut:
    """A new conversation of the current user, live in this server (with external workers:
    stored and let go)."""
    async with state.new_conversation(user, body.model, context, name=body.name) as conversation:
        conversation_id = conversation.id
    return await _listed(state.service, user, conversation_id, context)


async def _listed(service: ConversationService, user: str, conversation_id: str, context: Context) -> ConversationOut:
    """The conversation as the listing shows it, its times as the store keeps them."""
    return ConversationOut.of(await service.info(user, conversation_id, context))


@router.get("/conversations", response_model=list[ConversationOut])
async def list_conversations(user: CurrentUser, state: State, context: RequestContext) -> list[ConversationOut]:
    """The current user's conversations, most recently updated first."""
    return [ConversationOut.of(info) for info in await state.service.list(user, context)]


class ConversationView(ConversationOut):
    """A conversation as its view opens it: the listing's fields and the model its next request
    goes to (a switch queued behind a running turn is not it yet: the `model` row says when it is)."""

    model: ModelIdentity


@router.get("/conversations/{conversation_id}", response_model=ConversationView)
async def read_conversation(conversation_id: str, user: CurrentUser, state: State,
                            context: RequestContext) -> ConversationView:
    """One conversation of the current user, read from the journal whoever holds it."""
    return await _cold_view(state.service, user, conversation_id, context)


async def _cold_view(service: ConversationService, user: str, conversation_id: str,
                     context: Context) -> ConversationView:
    listed = await _listed(service, user, conversation_id, context)  # the owner check too
    session = await service.store.open_session(conversation_id, context)
    config = await session.get(addresses.lane_config(MAIN_LANE), context)
    if config is None:
        raise StorageCorruption(f"conversation {conversation_id} has no main lane", session_id=conversation_id)
    return ConversationView(**listed.model_dump(), model=config.model)


class RenameConversation(_Body):
    name: str | None = Field(max_length=NAME_CHARS, description="The new name; null clears it.")


@router.patch("/conversations/{conversation_id}", response_model=ConversationOut)
async def rename_conversation(conversation_id: str, body: RenameConversation, user: CurrentUser, state: State,
                              context: RequestContext) -> ConversationOut:
    """Rename the conversation, with a row the model reads (once someone has spoken)."""
    await state.service.rename(user, conversation_id, body.name, context)
    return await _listed(state.service, user, conversation_id, context)


@router.delete("/conversations/{conversation_id}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_conversation(conversation_id: str, user: CurrentUser, state: State, context: RequestContext) -> None:
    """Delete the conversation and everything in its journal, for good (`ConversationService.delete`).
    Refused with `conversation_in_use` (409) while a request of this server uses it or a turn of it
    is driven here (stop it first), with `session_owned` (409) while another process holds it;
    nothing is deleted then. 404 for a missing conversation or another user's."""
    await state.service.check_owner(user, conversation_id, context)
    await state.holds.delete(user, conversation_id, context)


@router.post("/conversations/{conversation_id}/close", status_code=status.HTTP_204_NO_CONTENT)
async def close_conversation(conversation_id: str, user: CurrentUser, state: State, context: RequestContext) -> None:
    """Detach the live conversation from this server (nothing of it is lost; the next request
    opens it again). Refused with `lane_busy` (409) while a run is open: stop it first; with
    `conversation_in_use` (409) while another request uses it (`Holds.close`). With external
    workers nothing is attached here: only the owner check."""
    await state.service.check_owner(user, conversation_id, context)
    if state.external or (conversation := state.service.live(conversation_id)) is None:
        return
    if (operation := conversation.operation()) is not None:
        raise LaneBusy(f"conversation {conversation_id} has a run open; stop it first", operation_id=operation.id)
    await state.holds.close(user, conversation_id, context)


class ModelOut(BaseModel):
    """A model a conversation may switch to: its identity, its display name, its context window in
    tokens, and whether the key it needs is set on the server (False: a request to it fails)."""

    provider: str
    model_id: str
    name: str
    context_window: int
    key_present: bool


@router.get("/models", response_model=list[ModelOut], tags=["models"])
async def list_models(user: CurrentUser, state: State) -> list[ModelOut]:
    """The server's model registry in preference order (built-in models, then `models.toml`'s);
    empty when the server was given no registry."""
    registry = state.service.setup.models
    rows = registry.configured() if registry is not None else []
    return [ModelOut(provider=row.model.provider, model_id=row.model.id, name=row.model.name or row.model.id,
                     context_window=row.model.context_window, key_present=row.key_present) for row in rows]


# -- turns ---------------------------------------------------------------------------------------


class ImageIn(_Body):
    data: str = Field(description="The image's bytes, base64.")
    mime_type: str = Field(max_length=100)


class SendMessage(_Body):
    text: str = Field(description="The prompt; may be empty only with images.")
    images: list[ImageIn] = []
    output_schema: dict[str, JsonValue] | None = Field(
        None, description="A JSON Schema the run's final answer must fit: the answer is sent back to the model "
                          "while it does not (twice at most, then the run fails output_invalid), and the one that "
                          "fits is a structured_output entry of the conversation.")


class Accepted(BaseModel):
    """An accepted run, durable: the server drives it; watch `/events` for its progress."""

    operation_id: str
    entry_ids: list[str]


@router.post("/conversations/{conversation_id}/messages", status_code=status.HTTP_202_ACCEPTED,
             response_model=Accepted)
async def send_message(conversation_id: str, body: SendMessage, user: CurrentUser, state: State,
                       context: RequestContext) -> Accepted:
    """Start a turn: answered once it is durable (202), driven by the server. `lane_busy` (409)
    while a run is open (steer or follow up instead), `prompt_too_large` (413),
    `conversation_ended` (409), `invalid_input` for an `output_schema` that is not a JSON Schema."""
    images = [ImageContent(data=image.data, mime_type=image.mime_type) for image in body.images]
    try:
        output = OutputSchema.of(body.output_schema) if body.output_schema is not None else None
    except ValidationError as error:
        raise InvalidInput(f"output_schema cannot be stored: {error.errors()[0]['msg']}") from error
    _, accepted = await state.start_turn(user, conversation_id, body.text, context, images=images, output=output)
    return Accepted(operation_id=accepted.operation_id, entry_ids=list(accepted.entry_ids))


class QueueMessage(_Body):
    text: str = Field(min_length=1)


class Queued(BaseModel):
    """A message queued by its pre-minted entry id, placed when the run reaches its boundary.
    With external workers `entry_id` is null and `request_id` names the request posted for the
    worker driving the run, which queues it when it takes it."""

    entry_id: str | None
    request_id: str | None = None


@router.post("/conversations/{conversation_id}/steer", status_code=status.HTTP_202_ACCEPTED, response_model=Queued)
async def steer(conversation_id: str, body: QueueMessage, user: CurrentUser, state: State,
                context: RequestContext) -> Queued:
    """Steer the running turn: read after its current tool calls, before its next request.
    `no_active_operation` (409) when nothing runs."""
    entry_id, request_id = await state.queue(user, conversation_id, "steer", body.text, context)
    return Queued(entry_id=entry_id, request_id=request_id)


@router.post("/conversations/{conversation_id}/follow-up", status_code=status.HTTP_202_ACCEPTED,
             response_model=Queued)
async def follow_up(conversation_id: str, body: QueueMessage, user: CurrentUser, state: State,
                    context: RequestContext) -> Queued:
    """Queue a follow-up of the running turn: read when it would otherwise end.
    `no_active_operation` (409) when nothing runs."""
    entry_id, request_id = await state.queue(user, conversation_id, "follow_up", body.text, context)
    return Queued(entry_id=entry_id, request_id=request_id)


class Stopped(BaseModel):
    """The durable abort of `operation_id`; `newly_requested` False when one was already recorded."""

    operation_id: str
    newly_requested: bool


@router.post("/conversations/{conversation_id}/stop", status_code=status.HTTP_202_ACCEPTED, response_model=Stopped)
async def stop(conversation_id: str, user: CurrentUser, state: State, context: RequestContext) -> Stopped:
    """Stop the running turn durably (cause `user`), wherever it is driven; it settles `aborted`
    with every open tool call answered. `no_active_operation` (409) when nothing runs."""
    request = await state.stop(user, conversation_id, context)
    return Stopped(operation_id=request.operation_id, newly_requested=request.newly_requested)


# -- commands ------------------------------------------------------------------------------------


class CommandOut(BaseModel):
    """A command the command route runs: the `name` typed after `/`, its `usage` and a one-line
    `summary` of what it does, as the command table gives them (`DescribedCommand`)."""

    name: str
    usage: str
    summary: str


@router.get("/commands", response_model=list[CommandOut])
async def list_commands(user: CurrentUser) -> list[CommandOut]:
    """The built-in commands the command route runs (the table the terminal's chat runs them from),
    in the table's order, with the words the terminal's `/help` shows, for a surface's completion."""
    return [CommandOut(name=name, usage=command.usage, summary=command.summary)
            for name, command in BUILT_IN_COMMANDS.items()]


class TypedCommand(_Body):
    line: str = Field(max_length=TEXT_CHARS, description="The command as typed: `/name args`.",
                      examples=["/rename notes"])


@router.post("/conversations/{conversation_id}/command", response_model=CommandOutcome | PostedCommand,
             responses={202: {"model": PostedCommand, "description": "Posted to the process that holds the "
                                                                     "conversation, which runs it."}})
async def command(conversation_id: str, body: TypedCommand, response: Response, user: CurrentUser, state: State,
                  context: RequestContext) -> CommandOutcome | PostedCommand:
    """Run a typed built-in command (`/compact`, `/fast`, `/model`, `/rename`, `/mode`,
    `/restart`; `/goal` has its own route), recorded as one row (CE-16): 200 with its outcome;
    202 when another process (a chat, a worker) holds the conversation: the command is posted to
    it, and its row (or its failure's) reaches `/events` when it ran. `unknown_command` (400).
    With external workers `/compact`, which would drive, is `external_mode_unsupported` (501)."""
    commands: Mapping[str, BuiltInCommand] = (
        {**BUILT_IN_COMMANDS, "compact": _compact_refused} if state.external else BUILT_IN_COMMANDS)
    outcome = await state.service.command(user, conversation_id, body.line, context, commands=commands)
    if isinstance(outcome, PostedCommand):
        response.status_code = status.HTTP_202_ACCEPTED
    return outcome


async def _compact_refused(service: ConversationService, user: str, conversation: Conversation, args: str | None,
                           context: Context, *, typed: bool = True) -> CommandOutcome:
    raise ExternalModeUnsupported("/compact drives a summary, which a server whose workers are external never "
                                  "does", route="/compact")


class CompactBody(_Body):
    instructions: str | None = Field(default=None, max_length=TEXT_CHARS, description="What the summary should keep.")


@router.post("/conversations/{conversation_id}/compact", response_model=CompactOutcome)
async def compact_route(conversation_id: str, body: CompactBody, user: CurrentUser, state: State,
                        context: RequestContext) -> CompactOutcome:
    """`/compact`: summarize the older part of the conversation (recorded). `lane_busy` (409);
    `external_mode_unsupported` (501) with external workers."""
    state.refuse_if_external("/compact")
    async with state.conversation(user, conversation_id, context) as conversation:
        return await compact(state.service, user, conversation, body.instructions, context)


@router.post("/conversations/{conversation_id}/fast", response_model=FastOutcome)
async def fast_route(conversation_id: str, user: CurrentUser, state: State, context: RequestContext) -> FastOutcome:
    """`/fast`: switch to the fast model, or back (recorded). `no_fast_model` (400)."""
    async with state.conversation(user, conversation_id, context) as conversation:
        return await fast(state.service, user, conversation, None, context)


class SwitchModel(_Body):
    model: ModelIdentity
    wait_for_completion: bool = Field(default=False, description="Answer once the switch applied (200), "
                                      "however long the running turn takes, instead of 202 `queued`.")


@router.put("/conversations/{conversation_id}/model", response_model=ModelSwitch,
            responses={202: {"model": ModelSwitch, "description": "Queued behind the running turn."}})
async def switch_model(conversation_id: str, body: SwitchModel, response: Response, user: CurrentUser,
                       state: State, context: RequestContext) -> ModelSwitch:
    """Switch the model under the turn lock (CE-12): 200 when it applied, 202 with `queued` when
    it waits for the running turn (its row is written when it applies). `model_switch_refused`
    (409) when a later pick superseded it, `model_unavailable` (400)."""
    switch = await state.service.switch_model(user, conversation_id, body.model, context,
                                              wait_for_completion=body.wait_for_completion)
    if switch.queued:
        response.status_code = status.HTTP_202_ACCEPTED
    return switch


class LocalShell(_Body):
    command: ShellCommand = Field(description="A shell command, run in the conversation's directory.")


class ShellOut(BaseModel):
    exit_code: int | None
    output: str = Field(description="What it printed (stdout and stderr), its last characters as recorded.")
    recorded: bool


@router.post("/conversations/{conversation_id}/shell", response_model=ShellOut)
async def local_shell(conversation_id: str, body: LocalShell, user: CurrentUser, state: State,
                      context: RequestContext) -> ShellOut:
    """`!cmd`: run `command` on the server in the conversation's directory (its project's, or the
    server's own) and record it as a row the model reads with the next message (CE-17)."""
    async with state.conversation(user, conversation_id, context) as conversation:
        directory = conversation.target.directory
    row, recorded = await state.service.run_local_shell(user, conversation_id, body.command, directory, context)
    return ShellOut(exit_code=row.exit_code, output=row.output, recorded=recorded)


@router.get("/projects", response_model=list[SwitchableProject])
async def list_projects(user: CurrentUser, state: State) -> Sequence[SwitchableProject]:
    """The projects a conversation may switch to (CE-21); `projects_file_invalid` (400)."""
    return state.service.list_switchable_projects(user)


class SelectProject(_Body):
    execution_ref: str


@router.put("/conversations/{conversation_id}/project", response_model=DirectoryMoved,
            responses={202: {"model": DirectoryMoved, "description": "Posted to the process that holds it."}})
async def select_project(conversation_id: str, body: SelectProject, response: Response, user: CurrentUser,
                         state: State, context: RequestContext) -> DirectoryMoved:
    """Switch the conversation's tools to a listed project (CE-19 to CE-21): 200 with its row;
    202 with the row it will record when another process holds the conversation (a refusal there
    is an error row). `project_switch_refused` (409, with its `reason`) and nothing stored."""
    switch = await state.service.select_project_execution(user, conversation_id, body.execution_ref, context)
    if switch.queued:
        response.status_code = status.HTTP_202_ACCEPTED
    return switch.row


# -- approvals, the display read, images -----------------------------------------------------------


@router.get("/conversations/{conversation_id}/approvals", response_model=list[PendingApproval])
async def list_approvals(conversation_id: str, user: CurrentUser, state: State,
                         context: RequestContext) -> list[PendingApproval]:
    """The tool calls of this conversation waiting for an answer, whichever process drives it
    (issue 28)."""
    return await state.approvals.listed(await state.reader(user, conversation_id, context), context)


class ApprovalAnswer(_Body):
    allow: bool
    for_session: bool = Field(default=False, description="Allow this tool for the rest of the conversation.")
    reason: str | None = Field(default=None, max_length=2_000, description="Told to the model on a refusal.")


@router.post("/conversations/{conversation_id}/approvals/{tool_call_id}", response_model=PendingApproval,
             responses={202: {"model": PendingApproval, "description": "Posted to the process that holds it."}})
async def answer_approval(conversation_id: str, tool_call_id: str, body: ApprovalAnswer, response: Response,
                          user: CurrentUser, state: State, context: RequestContext) -> PendingApproval:
    """Answer a waiting call, wherever it waits (this server, a worker, a terminal chat, another
    server: `ConversationService.answer_approval`, issue 30): 200 once the run took this answer;
    202 when it waits in another process that has not taken the posted answer yet. The first
    answer wins: a later one, or one after the run was stopped, is `approval_answered` (409) and
    changes nothing; `approval_not_found` (404) when no such call waits."""
    pending, posted = await state.service.answer_approval(
        user, conversation_id, tool_call_id, Approval(allow=body.allow, for_session=body.for_session,
                                                      reason=body.reason), context)
    if posted:
        response.status_code = status.HTTP_202_ACCEPTED
    return pending


@router.get("/conversations/{conversation_id}/display", response_model=DisplayPage)
async def read_display(conversation_id: str, user: CurrentUser, state: State, context: RequestContext,
                       before: str | None = None,
                       limit: Annotated[int, Query(ge=1, le=MAX_DISPLAY_PAGE)] = DISPLAY_PAGE) -> DisplayPage:
    """One page of the rows a screen draws, newest page first, rows oldest first (CE-24); pass
    `next_before` as `before` for the older page. `unknown_entry` (404) for a `before` not in it."""
    return await state.service.read_display(user, conversation_id, context, before=before, limit=limit)


@router.get("/conversations/{conversation_id}/images/{ref}", response_class=Response,
            responses={200: {"content": {"image/png": {}, "image/jpeg": {}, "image/gif": {}, "image/webp": {}}}})
async def read_image(conversation_id: str, ref: str, user: CurrentUser, state: State,
                     context: RequestContext) -> Response:
    """A card's picture, to the conversation's owner only (CE-24); `image_not_found` (404)."""
    image = await state.service.read_image(user, conversation_id, ref, context)
    return _image_response(image)


@router.get("/conversations/{conversation_id}/messages/{entry_id}/images/{index}", response_class=Response,
            responses={200: {"content": {"image/png": {}, "image/jpeg": {}, "image/gif": {}, "image/webp": {}}}})
async def read_prompt_image(conversation_id: str, entry_id: str, index: int, user: CurrentUser, state: State,
                            context: RequestContext) -> Response:
    """Image `index` (from 0) the person sent with message `entry_id` (a display `user` row's id;
    its `image_count` says how many), to the conversation's owner only; `image_not_found` (404)."""
    image = await state.service.read_prompt_image(user, conversation_id, entry_id, index, context)
    return _image_response(image)


def _image_response(image: StoredImage) -> Response:
    # An image is immutable: a card's by its content ref, a message's as its entry is.
    return Response(image.data, media_type=image.mime_type,
                    headers={"Cache-Control": "private, max-age=31536000, immutable",
                             "X-Content-Type-Options": "nosniff"})


@router.get("/conversations/{conversation_id}/usage", response_model=Usage)
async def read_usage(conversation_id: str, user: CurrentUser, state: State, context: RequestContext) -> Usage:
    """What the conversation has spent: tokens by kind and their cost in US dollars, summed over
    its usage ledger, adjustments included."""
    return await state.service.usage(user, conversation_id, context)
