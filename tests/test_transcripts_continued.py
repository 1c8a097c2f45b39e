"""Real transcripts, imported, read back as conversations whose stopped and failed turns, local
commands and compactions are chat-event rows, and continued with one more turn through
`ConversationService` with a request every wire format accepts (issue 6, "Real input, end to end";
issue 13, CE-7, CE-8, CE-9, CE-16, CE-17).

The real transcripts in `../shared/fixtures/transcripts` (see its PROVENANCE.md) run when that
folder lies beside the checkout; the project's own small ones in `tests/transcripts` (written by
hand in the same shapes, see its README) run in every clone."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO, SHARED_FIXTURES, needs_shared_fixtures
from drive_helpers import FAUX, within
from harness.context import Context
from harness.conversation import (
    ChatEventDetails,
    CommandRan,
    Compacted,
    ConversationService,
    ConversationSetup,
    Forbidden,
    Interrupted,
)
from harness.conversation.service import chat_event_rows
from harness.imports import import_claude_code_session, import_pi_session
from harness.messages import AssistantMessage, TextContent
from harness.providers import FAUX_MODEL, FauxProvider, ModelRegistry, ProviderRequest, StreamOptions
from harness.runtime import DriveSettings, Settled
from harness.session import Store
from journal_helpers import lane_branch
from request_validators import problems
from test_provider_requests import BUILDERS, TEXT_ONLY, VISION

USER = "importer"
REAL = SHARED_FIXTURES / "transcripts"
OWN = REPO / "tests" / "transcripts"

# The rows each transcript's person saw, in order, as (kind, cause / command / reason).
ROWS: dict[Path, list[tuple[str, ...]]] = {
    REAL / "claude-code-rejected-parallel-tools.jsonl": [("interrupted", "user_during_tool"), ("command", "model")],
    REAL / "claude-code-interrupts-background-bash.jsonl": [
        ("interrupted", "user"), ("command", "mcp"), ("command", "mcp"), ("interrupted", "user")],
    REAL / "claude-code-after-compaction-excerpt.jsonl": [("compacted", "threshold")],
    REAL / "pi-session-v1-error-terminated.jsonl": [("interrupted", "user"), ("error",)],
    REAL / "pi-session-v1-compaction.jsonl": [("interrupted", "user")] * 6,  # its 6 aborted replies
    OWN / "claude-code-small.jsonl": [
        ("compacted", "manual"), ("interrupted", "user_during_tool"), ("command", "model"), ("error",),
        ("interrupted", "user"), ("command", "doctor")],
    OWN / "pi-small.jsonl": [("interrupted", "user"), ("error",)],
}
TRANSCRIPTS = [pytest.param(path, id=path.stem, marks=[needs_shared_fixtures] if path.parent == REAL else [])
               for path in ROWS]


@pytest.fixture
def store_url() -> str:
    """Memory only: the owner record and the rows are plain journal writes, which the conformance
    suite covers on every backend."""
    return "memory://"


def shape(details: ChatEventDetails) -> tuple[str, ...]:
    match details:
        case Interrupted():
            return ("interrupted", details.cause)
        case CommandRan():
            return ("command", details.name)
        case Compacted():
            return ("compacted", details.reason)
        case _:
            return (details.kind,)


async def imported(store: Store, path: Path, ctx: Context) -> str:
    importer = import_pi_session if path.name.startswith("pi-") else import_claude_code_session
    return (await importer(store, path, USER, ctx)).session_id


def conversations(store: Store, faux: FauxProvider) -> ConversationService:
    setup = ConversationSetup(models=ModelRegistry([FAUX_MODEL], providers={"faux": faux}),
                              drive=DriveSettings(frame_interval_s=0))
    return ConversationService(store, setup)


@pytest.mark.parametrize("path", TRANSCRIPTS)
async def test_an_imported_transcript_is_a_conversation_whose_stopped_turns_are_chat_event_rows(
    store: Store, ctx: Context, path: Path
) -> None:
    """CE-7, CE-9, CE-16, CE-17: what the source showed the person as an interruption, a failed
    turn, a local command or a compaction reads back as that chat-event row, in order; the
    importing user owns the conversation."""
    conversation_id = await imported(store, path, ctx)
    service = conversations(store, FauxProvider([]))

    conversation = await service.open(USER, conversation_id, ctx)

    rows = chat_event_rows(await lane_branch(store, conversation.id, ctx))
    assert [shape(row.details) for row in rows] == ROWS[path]
    assert conversation.info.owner == USER
    with pytest.raises(Forbidden):
        await service.open("someone-else", conversation_id, ctx)
    await service.close_all(ctx)


@pytest.mark.parametrize("path", TRANSCRIPTS)
async def test_an_imported_conversation_continues_with_a_valid_request_in_every_format(
    store: Store, ctx: Context, path: Path
) -> None:
    """CE-8: one more prompt sends no aborted or errored reply as such (their text is replayed),
    and the request is one every wire format accepts."""
    conversation_id = await imported(store, path, ctx)
    faux = FauxProvider(["Continuing from here."])
    service = conversations(store, faux)
    conversation = await service.open(USER, conversation_id, ctx)
    await conversation.switch_model(FAUX, ctx)

    outcome = await within(service.send(USER, conversation_id, "Please go on.", ctx))

    assert isinstance(outcome, Settled)
    assert outcome.result.outcome == "completed"
    sent = faux.requests[0].request
    assert sent.messages[-1].content == "Please go on."
    replies = [m for m in sent.messages if isinstance(m, AssistantMessage)]
    assert [m for m in replies if m.stop_reason in ("aborted", "error")] == []
    for api, build in BUILDERS.items():
        for model in (VISION[api], TEXT_ONLY[api]):
            params = build(model, ProviderRequest(system_prompt=sent.system_prompt, messages=sent.messages,
                                                  tools=sent.tools), StreamOptions())
            assert problems(api, params, model) == [], (api, model.id)
    await service.close_all(ctx)


async def test_a_stopped_pi_reply_is_replayed_as_its_text_without_its_unfinished_calls(
    store: Store, ctx: Context
) -> None:
    """CE-8: pi's aborted reply and its errored one (with two calls never run) reach the model as
    the text the person saw, after the rows that say why they stopped."""
    conversation_id = await imported(store, OWN / "pi-small.jsonl", ctx)
    faux = FauxProvider(["Continuing from here."])
    service = conversations(store, faux)
    conversation = await service.open(USER, conversation_id, ctx)
    await conversation.switch_model(FAUX, ctx)

    await within(service.send(USER, conversation_id, "Please go on.", ctx))

    sent = faux.requests[0].request.messages
    replayed = [m for m in sent if isinstance(m, AssistantMessage) and m.stop_reason == "stop"]
    assert [m.content for m in replayed] == [
        [TextContent(text="I'll start by")], [TextContent(text="It is a small project.")],
        [TextContent(text="Checking the sources.")]]
    assert sent[-3].content == "[The request failed: terminated]"  # then the switch's row, then the prompt
    await service.close_all(ctx)


async def test_a_claude_code_api_error_is_the_error_row_and_never_a_reply(store: Store, ctx: Context) -> None:
    """CE-9: Claude Code's stand-in message for a failed API call is the turn's error row with its
    public text; the model reads it as that row, not as something it said."""
    conversation_id = await imported(store, OWN / "claude-code-small.jsonl", ctx)
    faux = FauxProvider(["Continuing from here."])
    service = conversations(store, faux)
    conversation = await service.open(USER, conversation_id, ctx)
    await conversation.switch_model(FAUX, ctx)

    await within(service.send(USER, conversation_id, "Please go on.", ctx))

    sent = faux.requests[0].request.messages
    assert not [m for m in sent if isinstance(m, AssistantMessage) and "API Error" in str(m.content)]
    assert [m.content for m in sent if m.role == "custom" and "API Error" in str(m.content)] == [
        '[The request failed: API Error: 529 {"type":"error","error":{"type":"overloaded_error",'
        '"message":"Overloaded"}}]']
    await service.close_all(ctx)
