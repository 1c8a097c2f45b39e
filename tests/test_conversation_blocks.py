"""Message blocks and the display read, through `ConversationService` on every backend: a tool
result's blocks bounded, cleaned and their images stored by content (CE-22), the reply's blocks
appended at run end (CE-23), the paged display read, the live blocks event, owner-only images and
the sweep (CE-24). White-box in one test: the terminal's row renderers (`harness.cli.chat_view`,
`harness.cli.render`) are called in-process to show they draw no card."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from collections.abc import Sequence
from dataclasses import replace

import pytest
from pydantic import JsonValue
from rich.console import Console

from conversation_helpers import faux_service as service
from drive_helpers import FAUX, within
from harness.cli.chat_view import ChatView, Screen, entry_summary
from harness.cli.render import entry_lines, print_branch
from harness.context import Context
from harness.conversation import (
    MAX_TOOL_BLOCKS,
    MESSAGE_BLOCKS_TYPE,
    AssistantRow,
    BlockImage,
    BlocksRow,
    ConversationService,
    ConversationSetup,
    EventRow,
    Forbidden,
    ImageNotFound,
    MessageBlock,
    MessageBlocksPublished,
    Renamed,
    SenderRow,
    ToolRow,
    UserRow,
)
from harness.conversation.blocks import MAX_MESSAGE_BLOCKS, TITLE_CHARS
from harness.imports import export_harness_session
from harness.messages import AssistantMessage, CustomMessage, TextContent, ToolResultMessage
from harness.providers import FauxProvider, Model, StreamOptions, ToolSpec, openai_chat
from harness.providers.faux import FauxScript, failure, reply, tool_call
from harness.runtime import (
    AgentTool,
    DriveSettings,
    EntryAdded,
    NothingToResume,
    ProgressCallback,
    RunHooks,
    Settled,
    ToolCallRequest,
    ToolEnd,
    ToolOutput,
)
from harness.session import CustomPayload, Entry, LaneConfig, MessagePayload, Store
from harness.session.images import image_ref

ALICE, BOB = "alice", "bob"
CONFIG = LaneConfig(model=FAUX, active_tools=["cards"])
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg==")
GIF = b"GIF89a\x01\x00\x01\x00\x00\x00\x00;"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def card(key: str, **fields: JsonValue) -> dict[str, JsonValue]:
    return {"key": key, "title": f"Card {key}", "text": f"about {key}", **fields}


class CardTool:
    """The `cards` tool: it answers "here are cards" with `details`, or with each of `outputs`
    in turn, one per call (`(details, is_error)`)."""

    def __init__(self, details: JsonValue = None, *, outputs: Sequence[tuple[JsonValue, bool]] = ()) -> None:
        self.outputs = list(outputs) or [(details, False)]

    @property
    def tool(self) -> AgentTool:
        spec = ToolSpec(name="cards", description="offers cards", parameters={"type": "object", "properties": {}})
        return AgentTool(spec=spec, execute=self.execute, replay="safe")

    async def execute(self, call_id: str, args: dict[str, JsonValue], on_update: ProgressCallback,
                      context: Context) -> ToolOutput:
        details, is_error = self.outputs.pop(0) if len(self.outputs) > 1 else self.outputs[0]
        return ToolOutput(content=[TextContent(text="here are cards")], details=details, is_error=is_error)


def card_service(store: Store, script: FauxScript, cards: CardTool, *,
                 setup: ConversationSetup | None = None) -> tuple[ConversationService, FauxProvider]:
    base = replace(setup or ConversationSetup(), drive=DriveSettings(frame_interval_s=0))
    return service(store, script, tools=[cards], setup=base)


def settled(outcome: object) -> Settled:
    assert isinstance(outcome, Settled), outcome
    assert outcome.result.outcome == "completed", outcome.result
    return outcome


async def entries_of(store: Store, conversation_id: str, ctx: Context) -> list[Entry]:
    """Every entry of the conversation's journal, in commit order."""
    session = await store.open_session(conversation_id, ctx)
    return await session.read_entries(ctx, limit=10_000)


def tool_results(entries: list[Entry]) -> list[ToolResultMessage]:
    return [e.payload.message for e in entries
            if isinstance(e.payload, MessagePayload) and isinstance(e.payload.message, ToolResultMessage)]


def blocks_entries(entries: list[Entry]) -> list[Entry]:
    return [e for e in entries if isinstance(e.payload, CustomPayload) and e.payload.custom_type == MESSAGE_BLOCKS_TYPE]


# -- after the tool call (CE-22) -------------------------------------------------------------------


async def test_blocks_are_cleaned_bounded_and_their_images_stored_once_by_content(store: Store, ctx: Context) -> None:
    """CE-22: control characters go, a long title is cut, a non-http link is refused, extra
    candidates are dropped; each image is sniffed from its bytes (the claimed type is ignored),
    stored once by its SHA-256, and the journal holds its `{ref}` and never its base64."""
    offered: list[JsonValue] = [
        card("alpha", title="Al\x1bpha\u202e\nCard", text="line one\nline\x07 two",
             link="https://example.com/a", image={"data": b64(PNG), "mime_type": "image/gif"}),
        card("beta", title="B" * (TITLE_CHARS + 50), link="javascript:alert(1)", image={"data": b64(PNG)}),
        card("gamma", image={"data": b64(b"not an image at all")}),
        {"title": "no key"},
        *[card(f"extra{i}") for i in range(MAX_TOOL_BLOCKS)],
    ]
    cards = CardTool({"blocks": offered, "other": 1})
    conversations, _ = card_service(store, [reply(tool_call("cards")), "done"], cards)
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    settled(await within(conversations.send(ALICE, conversation.id, "go", ctx)))

    entries = await entries_of(store, conversation.id, ctx)
    [result] = tool_results(entries)
    assert isinstance(result.details, dict)
    assert result.details["other"] == 1
    kept = [MessageBlock.model_validate(block) for block in result.details["blocks"]]  # type: ignore[union-attr]
    assert len(kept) == MAX_TOOL_BLOCKS
    ref = image_ref(PNG)
    assert kept[0] == MessageBlock(key="alpha", title="Alpha Card", text="line one\nline two",
                                   link="https://example.com/a", image=BlockImage(ref=ref))
    assert kept[1].title == "B" * (TITLE_CHARS - 1) + "…"
    assert kept[1].link is None
    assert kept[1].image == BlockImage(ref=ref)
    assert kept[2].key == "gamma"
    assert kept[2].image is None
    assert kept[3].key == "extra0"
    assert list(await store.images.stored(ctx)) == [ref]  # two blocks, one copy
    image = await conversations.read_image(ALICE, conversation.id, ref, ctx)
    assert (image.mime_type, image.data) == ("image/png", PNG)  # what the bytes say, not the claim
    journal = json.dumps([entry.model_dump(mode="json") for entry in entries])
    assert b64(PNG) not in journal
    await conversations.close_all(ctx)


async def test_a_failed_result_loses_its_blocks_and_one_without_blocks_is_untouched(store: Store, ctx: Context) -> None:
    """CE-22: `is_error` drops `details.blocks` (and stores no image); details without `blocks`
    are stored exactly as the tool returned them."""
    cards = CardTool(outputs=[({"blocks": [card("alpha", image={"data": b64(PNG)})], "why": "it broke"}, True),
                              ({"plain": [1, "two"]}, False)])
    conversations, _ = card_service(store, [reply(tool_call("cards")), reply(tool_call("cards")), "alpha"], cards)
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    settled(await within(conversations.send(ALICE, conversation.id, "go", ctx)))

    entries = await entries_of(store, conversation.id, ctx)
    failed, plain = tool_results(entries)
    assert failed.is_error
    assert failed.details == {"why": "it broke"}
    assert plain.details == {"plain": [1, "two"]}
    assert await store.images.stored(ctx) == {}
    assert blocks_entries(entries) == []
    await conversations.close_all(ctx)


# -- at the end of the run (CE-23) -----------------------------------------------------------------


async def test_the_blocks_the_reply_mentions_are_one_entry_on_the_final_reply(store: Store, ctx: Context) -> None:
    """CE-23: first per key, only those the final reply names, at most 12, as one
    `harness.message-blocks` entry `{v: 1, blocks}` whose parent is the final reply; the live
    blocks event carries the entry's id (CE-24)."""
    offered: list[JsonValue] = [card("alpha", text="first"), card("alpha", text="second"), card("beta"),
                                card("unmentioned"), *[card(f"k{i}") for i in range(MAX_MESSAGE_BLOCKS)]]
    cards = CardTool({"blocks": offered})
    named = " ".join(f"k{i}" for i in range(MAX_MESSAGE_BLOCKS))
    conversations, _ = card_service(store, [reply(tool_call("cards")), f"See alpha and beta, then {named}."], cards)
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    watch = await conversation.watch(ctx)
    settled(await within(conversations.send(ALICE, conversation.id, "go", ctx)))

    entries = await entries_of(store, conversation.id, ctx)
    [entry] = blocks_entries(entries)
    assert isinstance(entry.payload, CustomPayload)
    assert isinstance(entry.payload.data, dict)
    assert entry.payload.data["v"] == 1
    blocks = [MessageBlock.model_validate(b) for b in entry.payload.data["blocks"]]  # type: ignore[union-attr]
    assert [b.key for b in blocks] == ["alpha", "beta", *[f"k{i}" for i in range(MAX_MESSAGE_BLOCKS - 2)]]
    assert blocks[0].text == "first"
    parent = next(e for e in entries if e.id == entry.parent_id)
    assert isinstance(parent.payload, MessagePayload)
    assert isinstance(parent.payload.message, AssistantMessage)
    assert parent.payload.message.content == [TextContent(text=f"See alpha and beta, then {named}.")]

    live = []
    async for event in watch:
        if isinstance(event, MessageBlocksPublished):
            live.append(event.row)
        if isinstance(event, EntryAdded) and event.entry.id == entry.id:
            break
    watch.close()
    page = await conversations.read_display(ALICE, conversation.id, ctx)
    [shown] = [row for row in page.rows if isinstance(row, AssistantRow) and row.blocks is not None]
    assert live == [shown.blocks]
    assert shown.blocks is not None
    assert shown.blocks.id == entry.id
    await conversations.close_all(ctx)


async def test_no_blocks_entry_after_a_provider_error(store: Store, ctx: Context) -> None:
    """CE-23: the turn fails at the provider after the tool offered blocks: nothing is appended
    (the run-end hook runs only for a run that completes; this keeps it that way)."""
    cards = CardTool({"blocks": [card("alpha")]})
    conversations, _ = card_service(store, [reply(tool_call("cards")), failure("invalid_request", "alpha refused")],
                                    cards)
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    outcome = await within(conversations.send(ALICE, conversation.id, "go", ctx))
    assert isinstance(outcome, Settled)
    assert outcome.result.outcome == "failed"
    assert blocks_entries(await entries_of(store, conversation.id, ctx)) == []
    await conversations.close_all(ctx)


async def test_the_next_request_is_the_same_with_or_without_the_blocks_entry(store: Store, ctx: Context) -> None:
    """CE-23, CE-24: the context read never projects a blocks entry: the request after a turn
    with blocks builds the same bytes as the same request sent from the reply itself (the tip
    moved back over the blocks entry)."""
    cards = CardTool({"blocks": [card("alpha", image={"data": b64(PNG)})]})
    conversations, faux = card_service(store, [reply(tool_call("cards")), "alpha it is", "one", "two"], cards)
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    settled(await within(conversations.send(ALICE, conversation.id, "go", ctx)))
    [entry] = blocks_entries(await entries_of(store, conversation.id, ctx))
    assert conversation.tip_id() == entry.id

    settled(await within(conversations.send(ALICE, conversation.id, "next", ctx)))
    await within(conversation.navigate(entry.parent_id, ctx))
    settled(await within(conversations.send(ALICE, conversation.id, "next", ctx)))

    with_entry, without = (faux.requests[-2].request, faux.requests[-1].request)
    model = Model(id="m", provider="openai", api="openai-chat")
    built = [json.dumps(openai_chat.build_request_params(model, request, StreamOptions()), sort_keys=True)
             for request in (with_entry, without)]
    assert built[0] == built[1]
    assert all(not isinstance(m, CustomMessage) for m in with_entry.messages)
    await conversations.close_all(ctx)


async def test_a_finished_turn_with_blocks_reads_final_after_a_restart(store: Store, ctx: Context) -> None:
    """CE-24: after reopening, nothing is open or resumable, the recovery snapshot ends the turn
    with the blocks entry as the tip, and the terminal draws the reply and no card."""
    cards = CardTool({"blocks": [card("alpha", title="Secret title")]})
    conversations, faux = card_service(store, [reply(tool_call("cards")), "alpha", "again"], cards)
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    settled(await within(conversations.send(ALICE, conversation.id, "go", ctx)))
    await conversations.close(ALICE, conversation.id, ctx)

    reopened = await conversations.open(ALICE, conversation.id, ctx)
    assert reopened.open_operations == []
    with pytest.raises(NothingToResume):
        await reopened.resume(ctx)
    watch = await reopened.watch(ctx)
    watch.close()
    assert watch.snapshot.operation is None
    last = watch.snapshot.transcript[-1]
    assert isinstance(last.payload, CustomPayload)
    assert last.payload.custom_type == MESSAGE_BLOCKS_TYPE
    assert entry_lines(last, None) == []
    assert "Secret title" not in entry_summary(last)
    settled(await within(conversations.send(ALICE, conversation.id, "more", ctx)))
    assert len(faux.requests) == 3  # the finished turn was not continued
    await conversations.close_all(ctx)


async def test_the_terminal_and_the_export_draw_no_blocks(store: Store, ctx: Context) -> None:
    """CE-24: the chat view draws nothing for the live blocks event or the entry; `harness show`
    prints the reply without its card; the export holds the entry's `{ref}` and no image bytes."""
    cards = CardTool({"blocks": [card("alpha", title="Secret title", image={"data": b64(PNG)})]})
    out = io.StringIO()
    view = ChatView(Screen(out, color=False), "main")
    conversations, _ = card_service(store, [reply(tool_call("cards")), "alpha shown"], cards,
                                    setup=ConversationSetup(listeners=[view]))
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    settled(await within(conversations.send(ALICE, conversation.id, "go", ctx)))
    view.screen.drain()
    assert "alpha shown" in out.getvalue()
    assert "Secret title" not in out.getvalue()

    printed = io.StringIO()
    await print_branch(conversation.journal, "main", ctx, console=Console(file=printed, width=200))
    assert "alpha shown" in printed.getvalue()
    assert "Secret title" not in printed.getvalue()
    assert "message-blocks" not in printed.getvalue()

    exported = io.StringIO()
    await export_harness_session(conversation.journal, exported, ctx)
    assert image_ref(PNG) in exported.getvalue()
    assert b64(PNG) not in exported.getvalue()
    await conversations.close_all(ctx)


# -- display reads (CE-24) -------------------------------------------------------------------------


async def test_the_display_read_shapes_every_kind_of_row(store: Store, ctx: Context) -> None:
    """CE-24: a user row, the reply with its blocks, the tool call with its result, a chat-event
    row and a message from another sender, oldest first; a hidden or sender-less custom message
    and other custom entries show nothing."""
    cards = CardTool({"blocks": [card("alpha")]})
    conversations, _ = card_service(store, [reply("looking", tool_call("cards", id="c1")), "alpha found"], cards)
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    settled(await within(conversations.send(ALICE, conversation.id, "find alpha", ctx)))
    assert await conversation.record(Renamed(name="cards"), ctx)
    garden = CustomMessage(custom_type="garden.operator", content="hello from the garden",
                           details={"sender": "gardener"})
    await conversation._lane.append_message(garden, ctx)
    await conversation._lane.append_message(CustomMessage(custom_type="app.note", content="hidden", display=False,
                                                         details={"sender": "app"}), ctx)
    await conversation._lane.append_custom("app.state", {"x": 1}, ctx)

    page = await conversations.read_display(ALICE, conversation.id, ctx)
    kinds = [row.kind for row in page.rows]
    assert kinds == ["user", "assistant", "tool", "assistant", "event", "message"]
    user, first, tool, final, event, sender = page.rows
    assert isinstance(user, UserRow)
    assert user.text == "find alpha"
    assert isinstance(first, AssistantRow)
    assert first.text == "looking"
    assert first.blocks is None
    assert isinstance(tool, ToolRow)
    assert tool.id == "c1"
    assert tool.assistant_id == first.id
    assert tool.result is not None
    assert tool.result.text == "here are cards"
    assert isinstance(final, AssistantRow)
    assert final.blocks is not None
    assert [b.key for b in final.blocks.blocks] == ["alpha"]
    assert isinstance(event, EventRow)
    assert event.details == Renamed(name="cards")
    assert isinstance(sender, SenderRow)
    assert (sender.sender, sender.text) == ("gardener", "hello from the garden")
    assert page.next_before is None
    await conversations.close_all(ctx)


async def test_a_page_boundary_makes_the_blocks_a_row_of_their_own(store: Store, ctx: Context) -> None:
    """CE-24: the newest page holds the blocks entry and not its reply: a `BlocksRow` naming the
    reply; the older page holds the reply without them, and a result whose call is on the older
    page is a tool row of its own with the call's id."""
    cards = CardTool({"blocks": [card("alpha")]})
    conversations, _ = card_service(store, [reply(tool_call("cards", id="c1")), "alpha"], cards)
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    settled(await within(conversations.send(ALICE, conversation.id, "go", ctx)))

    newest = await conversations.read_display(ALICE, conversation.id, ctx, limit=1)
    [row] = newest.rows
    assert isinstance(row, BlocksRow)
    assert [b.key for b in row.blocks] == ["alpha"]
    older = await conversations.read_display(ALICE, conversation.id, ctx, before=newest.next_before, limit=2)
    result_only, reply_row = older.rows
    assert isinstance(result_only, ToolRow)
    assert result_only.id == "c1"
    assert result_only.arguments is None
    assert isinstance(reply_row, AssistantRow)
    assert reply_row.id == row.assistant_id
    assert reply_row.blocks is None
    oldest = await conversations.read_display(ALICE, conversation.id, ctx, before=older.next_before)
    assert [r.kind for r in oldest.rows] == ["user", "assistant", "tool"]
    assert oldest.rows[2].id == "c1"
    assert oldest.next_before is None
    with pytest.raises(Forbidden):
        await conversations.read_display(BOB, conversation.id, ctx)
    await conversations.close_all(ctx)


async def test_rewind_and_fork_move_the_blocks_with_their_turn(store: Store, ctx: Context) -> None:
    """CE-23: the entry hangs on its reply: a fork after the turn keeps it, a rewind before the
    turn leaves it on the abandoned branch."""
    cards = CardTool({"blocks": [card("alpha")]})
    conversations, _ = card_service(store, [reply(tool_call("cards")), "alpha", "later"], cards)
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    settled(await within(conversations.send(ALICE, conversation.id, "go", ctx)))
    settled(await within(conversations.send(ALICE, conversation.id, "more", ctx)))

    fork = await store.fork_session(conversation.id, conversation.tip_id() or "", ctx)
    assert await conversations.adopt(ALICE, fork.id, ctx)
    forked = await conversations.read_display(ALICE, fork.id, ctx)
    assert [row.blocks is not None for row in forked.rows if isinstance(row, AssistantRow)] == [False, True, False]

    user = next(r for r in (await conversations.read_display(ALICE, conversation.id, ctx)).rows
                if isinstance(r, UserRow))
    await within(conversation.navigate(user.id, ctx))
    rewound = await conversations.read_display(ALICE, conversation.id, ctx)
    assert [row.kind for row in rewound.rows] == ["user"]
    await conversations.close_all(ctx)


# -- images: owner only, and the sweep (CE-24) -----------------------------------------------------


async def test_an_image_is_served_to_its_owner_only(store: Store, ctx: Context) -> None:
    """CE-24: another user is `Forbidden`; an unknown ref, and the ref of an image that only
    another conversation names, are `ImageNotFound`."""
    cards = CardTool({"blocks": [card("alpha", image={"data": b64(PNG)})]})
    conversations, _ = card_service(store, [reply(tool_call("cards")), "alpha"], cards)
    mine = await conversations.create(ALICE, CONFIG, ctx)
    settled(await within(conversations.send(ALICE, mine.id, "go", ctx)))
    other = await conversations.create(ALICE, CONFIG, ctx)
    ref = image_ref(PNG)

    assert (await conversations.read_image(ALICE, mine.id, ref, ctx)).data == PNG
    with pytest.raises(Forbidden):
        await conversations.read_image(BOB, mine.id, ref, ctx)
    for conversation_id, unknown in ((mine.id, "0" * 64), (mine.id, "../harness.db"), (other.id, ref)):
        with pytest.raises(ImageNotFound) as missing:
            await conversations.read_image(ALICE, conversation_id, unknown, ctx)
        assert missing.value.code == "image_not_found"
    await conversations.close_all(ctx)


async def test_the_sweep_keeps_every_referenced_image_and_deletes_the_rest(store: Store, ctx: Context) -> None:
    """CE-24: two sessions share an image: it stays while either names it and goes with the
    last; an image no entry names goes at once; one stored within the grace period stays."""
    cards = CardTool({"blocks": [card("alpha", image={"data": b64(PNG)})]})
    conversations, _ = card_service(store, [reply(tool_call("cards")), "alpha", reply(tool_call("cards")), "alpha"],
                                    cards)
    first = await conversations.create(ALICE, CONFIG, ctx)
    settled(await within(conversations.send(ALICE, first.id, "go", ctx)))
    second = await conversations.create(BOB, CONFIG, ctx)
    settled(await within(conversations.send(BOB, second.id, "go", ctx)))
    orphan = await store.images.put(GIF, ctx)
    await conversations.close_all(ctx)

    assert await conversations.sweep_images(ctx) == ()  # within the grace period
    assert await conversations.sweep_images(ctx, older_than_s=0) == (orphan,)
    await store.delete_session(first.id, ctx)
    assert await conversations.sweep_images(ctx, older_than_s=0) == ()
    assert (await conversations.read_image(BOB, second.id, image_ref(PNG), ctx)).data == PNG
    await store.delete_session(second.id, ctx)
    assert await conversations.sweep_images(ctx, older_than_s=0) == (image_ref(PNG),)
    assert await store.images.stored(ctx) == {}


async def test_a_pending_tool_result_keeps_its_image_through_a_sweep(store: Store, ctx: Context) -> None:
    """CE-24: a result staged but not yet placed (an earlier call of its batch still runs) names
    its image from a pending entry, and the sweep keeps it."""
    gate = asyncio.Event()
    cards = CardTool(outputs=[({"other": 1}, False), ({"blocks": [card("alpha", image={"data": b64(PNG)})]}, False)])

    async def hold(request: ToolCallRequest, output: ToolOutput, context: Context) -> ToolOutput | None:
        if request.tool_call_id == "first":
            await gate.wait()
        return None

    script: FauxScript = [reply(tool_call("cards", id="first"), tool_call("cards", id="second")), "alpha"]
    conversations, _ = card_service(store, script, cards, setup=ConversationSetup(hooks=RunHooks(after_tool=hold)))
    conversation = await conversations.create(ALICE, CONFIG, ctx)
    watch = await conversation.watch(ctx)
    running = asyncio.ensure_future(conversations.send(ALICE, conversation.id, "go", ctx))
    async for event in watch:
        if isinstance(event, ToolEnd) and event.tool_call_id == "second":
            break  # staged, and waiting for the first call's result to be placed before it
    watch.close()
    assert await conversations.sweep_images(ctx, older_than_s=0) == ()
    gate.set()
    settled(await within(running))
    assert (await conversations.read_image(ALICE, conversation.id, image_ref(PNG), ctx)).data == PNG
    await conversations.close_all(ctx)
