"""Message blocks: cards a tool offers, shown under the reply that mentions them (CE-22, CE-23).

A tool offers candidates in its result's `details.blocks`, a list of
`{key, title, text, link?, image?: {data}}` with `data` the image's bytes in base64. Providers never
receive `details`. When the call has its output, `normalize_tool_blocks` bounds and cleans the
candidates, stores each image in the store's image store by the SHA-256 of its bytes, sniffed from
the bytes (the claimed type is ignored), and writes the candidates back with `image: {ref}`, so no
image bytes reach the journal. A failed result loses its blocks; a result without `details.blocks`
is returned untouched.

When a run is about to finish, `message_blocks_at_run_end` reads the run's turn back to its user
message, keeps the candidates whose key the final reply mentions (first per key, at most
`MAX_MESSAGE_BLOCKS`) and appends them as one custom entry of type `harness.message-blocks`,
`{v: 1, blocks}`, on the final reply. The model never reads a custom entry: the next request is the
same with or without it.
"""

from __future__ import annotations

import base64
import binascii
import re
import unicodedata
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, JsonValue, ValidationError

from harness.context import Context
from harness.conversation.chat_events import logger
from harness.messages import AssistantMessage, Message, ToolResultMessage, text_of
from harness.runtime import Lane, ToolOutput
from harness.session import (
    CompactionPayload,
    CustomPayload,
    Entry,
    EntryPayload,
    ImageStore,
    MessagePayload,
    SessionReader,
    UnsupportedImage,
    addresses,
)
from harness.session.images import MAX_IMAGE_BYTES
from harness.session.records import PendingCustom, PendingEntry, PendingMessage

MESSAGE_BLOCKS_TYPE = "harness.message-blocks"
"""The custom type of the entry that holds a reply's accepted blocks (CE-23)."""

MAX_TOOL_BLOCKS = 24
"""Blocks kept from one tool result; later candidates are dropped."""
MAX_MESSAGE_BLOCKS = 12
"""Blocks one reply shows (CE-23)."""
KEY_CHARS = 80
TITLE_CHARS = 200
TEXT_CHARS = 2_000
LINK_CHARS = 2_048
"""Character limits of a block's key, title, text and link; longer titles and texts are cut (with
"…"), a longer key drops the block and a longer link drops the link."""

_BASE64_CHARS = (MAX_IMAGE_BYTES + 2) // 3 * 4  # the base64 length of the largest image kept
_REF_PAGE = 1_000


class _Block(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BlockImage(_Block):
    """A block's picture as the journal holds it: the ref of its bytes in the image store."""

    ref: str


class MessageBlock(_Block):
    """One card: `key` (what a reply names to show it), `title`, `text`, an optional http(s)
    `link` and an optional `image`."""

    key: str
    title: str
    text: str
    link: str | None = None
    image: BlockImage | None = None


class MessageBlocks(_Block):
    """The data of a `harness.message-blocks` entry (CE-23)."""

    v: Literal[1] = 1
    blocks: list[MessageBlock]


# -- after a tool call (CE-22) ---------------------------------------------------------------------

_DROPPED = re.compile("[\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")  # zero-width and bidi controls


def _clean(text: str, *, lines: bool) -> str:
    """`text` without control characters (an escape sequence would drive the reader's terminal)
    and without zero-width and direction-override characters (they let a card show other text
    than it holds). Tabs and newlines stay when `lines`; else each run of white space is one space."""
    kept = "".join(c for c in _DROPPED.sub("", text) if c.isspace() or unicodedata.category(c) != "Cc")
    return kept.strip() if lines else " ".join(kept.split())


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _link(value: JsonValue) -> str | None:
    """`value` as a link a person may follow: http or https with a host, no white space or
    control characters, at most `LINK_CHARS`; anything else is refused (None)."""
    if not isinstance(value, str) or len(value) > LINK_CHARS or any(
            c.isspace() or unicodedata.category(c) == "Cc" for c in value):
        return None
    try:
        parts = urlsplit(value)
    except ValueError:
        return None
    return value if parts.scheme in ("http", "https") and parts.hostname else None


async def _image(value: JsonValue, images: ImageStore, context: Context) -> BlockImage | None:
    """A candidate's picture stored by content: `{data}` with base64 bytes of a PNG, JPEG, GIF or
    WebP image (sniffed from the bytes), at most `MAX_IMAGE_BYTES`. A ref a tool names itself is
    refused: a ref is only ever minted here, so a card can never show an image its conversation
    did not store."""
    data = value.get("data") if isinstance(value, dict) else None
    if not isinstance(data, str) or len(data) > _BASE64_CHARS + 4:
        return None
    try:
        raw = base64.b64decode(data, validate=True)
        return BlockImage(ref=await images.put(raw, context))
    except (binascii.Error, UnsupportedImage) as error:
        logger.info("a block's image was refused: %s", error)
        return None


async def _candidate(value: JsonValue, images: ImageStore, context: Context) -> MessageBlock | None:
    if not isinstance(value, dict):
        return None
    key, title, text = value.get("key"), value.get("title"), value.get("text", "")
    if not (isinstance(key, str) and isinstance(title, str) and isinstance(text, str)):
        return None
    key = _clean(key, lines=False)
    if not key or len(key) > KEY_CHARS:
        return None
    image = await _image(value["image"], images, context) if "image" in value else None
    return MessageBlock(key=key, title=_cut(_clean(title, lines=False), TITLE_CHARS),
                        text=_cut(_clean(text, lines=True), TEXT_CHARS),
                        link=_link(value.get("link")), image=image)


async def normalize_tool_blocks(output: ToolOutput, images: ImageStore, context: Context) -> ToolOutput:
    """`output` with its `details.blocks` candidates bounded, cleaned and their images stored in
    `images`, each replaced by `{ref}` (CE-22). A failed output (`is_error`) loses its blocks;
    one whose details hold no `blocks` is returned as it is; a candidate that is not a card
    (no key or title, a key over `KEY_CHARS`) is dropped, and so is an image that is not one."""
    details = output.details
    if not isinstance(details, dict) or "blocks" not in details:
        return output
    rest = {name: value for name, value in details.items() if name != "blocks"}
    candidates = details["blocks"]
    if output.is_error or not isinstance(candidates, list):
        return output.model_copy(update={"details": rest or None})
    kept: list[JsonValue] = []
    for value in candidates:
        if len(kept) == MAX_TOOL_BLOCKS:
            break
        block = await _candidate(value, images, context)
        if block is None:
            logger.info("a tool offered a block that is not a card; dropped")
            continue
        kept.append(block.model_dump(mode="json", exclude_none=True))
    return output.model_copy(update={"details": {**rest, "blocks": kept}})


def tool_blocks(message: ToolResultMessage) -> list[MessageBlock]:
    """The blocks a normalized tool result holds; a candidate that does not parse is skipped."""
    details = message.details
    candidates = details.get("blocks") if isinstance(details, dict) else None
    blocks = []
    for value in candidates if isinstance(candidates, list) else ():
        try:
            blocks.append(MessageBlock.model_validate(value))
        except ValidationError:
            continue
    return blocks


# -- at the end of a run (CE-23) -------------------------------------------------------------------

def mentions(text: str, key: str) -> bool:
    """Whether `text` names `key` as a whole word: not inside a longer word or hyphenated name."""
    return re.search(rf"(?<![\w-]){re.escape(key)}(?![\w-])", text) is not None


def select_message_blocks(reply: str, candidates: Sequence[MessageBlock]) -> list[MessageBlock]:
    """The candidates `reply` mentions by key, in the order offered, the first of each key, at
    most `MAX_MESSAGE_BLOCKS` (CE-23)."""
    chosen: dict[str, MessageBlock] = {}
    for block in candidates:
        if block.key not in chosen and len(chosen) < MAX_MESSAGE_BLOCKS and mentions(reply, block.key):
            chosen[block.key] = block
    return list(chosen.values())


def message_blocks_at_run_end(session: SessionReader) -> Callable[[Lane, Context], Awaitable[None]]:
    """The run-end hook that appends a finished turn's `harness.message-blocks` entry (CE-23).

    It reads the branch back from the lane's tip to the turn's user message (or to a blocks entry,
    which means this run's blocks were already appended before a restart), takes the final reply
    and the blocks of the tool results before it, and appends the ones the reply mentions as one
    custom entry, placed on the final reply before the run settles. The harness calls it only for
    a run that completes, so a provider error or an abort appends nothing; nor does a reply that
    mentions no block."""

    async def at_run_end(lane: Lane, context: Context) -> None:
        tip = lane.tip_id
        if tip is None:
            return
        final: list[AssistantMessage] = []
        results: list[ToolResultMessage] = []

        def visit(entry: Entry) -> bool:
            payload = entry.payload
            if isinstance(payload, CustomPayload) and payload.custom_type == MESSAGE_BLOCKS_TYPE:
                final.clear()  # appended already: nothing more for this turn
                return False
            if not isinstance(payload, MessagePayload):
                return True
            message = payload.message
            if isinstance(message, AssistantMessage) and not final:
                final.append(message)
            elif isinstance(message, ToolResultMessage):
                results.append(message)
            return message.role != "user"

        await session.scan_branch(tip, visit, context)
        if not final:
            return
        reply = text_of(final[0].content, "\n")
        candidates = [block for result in reversed(results) for block in tool_blocks(result)]
        chosen = select_message_blocks(reply, candidates)
        if chosen:
            await lane.append_custom(MESSAGE_BLOCKS_TYPE, MessageBlocks(blocks=chosen).model_dump(
                mode="json", exclude_none=True), context)

    return at_run_end


def message_blocks_of(entry: Entry) -> MessageBlocks | None:
    """The blocks a `harness.message-blocks` entry holds; None for any other entry, and for one
    whose data this version does not know (logged, shown nowhere, like an unknown chat event)."""
    payload = entry.payload
    if not isinstance(payload, CustomPayload) or payload.custom_type != MESSAGE_BLOCKS_TYPE:
        return None
    try:
        return MessageBlocks.model_validate(payload.data)
    except ValidationError as error:
        logger.error("a message-blocks entry this version does not know: %s", error.errors()[0]["msg"])
        return None


# -- the refs the journal holds (CE-24) ------------------------------------------------------------

def _messages_of(payload: EntryPayload | PendingEntry) -> Iterator[Message]:
    if isinstance(payload, MessagePayload | PendingMessage):
        yield payload.message
    elif isinstance(payload, CompactionPayload):
        yield from payload.retained_tail


def image_refs(payload: EntryPayload | PendingEntry) -> set[str]:
    """The image refs an entry payload or a pending entry holds: those of the blocks of its tool
    results (a compaction's kept tail included) and of a `harness.message-blocks` entry."""
    refs = {block.image.ref for message in _messages_of(payload) if isinstance(message, ToolResultMessage)
            for block in tool_blocks(message) if block.image is not None}
    if isinstance(payload, CustomPayload | PendingCustom) and payload.custom_type == MESSAGE_BLOCKS_TYPE:
        try:
            data = MessageBlocks.model_validate(payload.data)
        except ValidationError:
            return refs
        refs |= {block.image.ref for block in data.blocks if block.image is not None}
    return refs


async def referenced_images(session: SessionReader, context: Context) -> set[str]:
    """Every image ref `session` holds: in any of its entries, on a branch or not, and in its
    pending entries (a tool result staged but not yet placed). Reads the whole journal of the
    session, page by page."""
    refs: set[str] = set()
    after: int | None = None
    while page := await session.read_entries(context, after_seq=after, limit=_REF_PAGE):
        for entry in page:
            refs |= image_refs(entry.payload)
        after = page[-1].seq
    for _, pending in await session.scan_values(addresses.pending_entry(""), context):
        refs |= image_refs(pending)
    return refs
