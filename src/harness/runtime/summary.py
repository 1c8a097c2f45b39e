"""What a compaction or a branch summary sends and keeps: token estimates, the cut point, the
summary request (cut to fit the model's window)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.messages import Message, TextContent, UserMessage
from harness.providers import ProviderRequest
from harness.runtime.branch_context import context_messages, estimate_tokens
from harness.session import Entry

SUMMARY_SYSTEM_PROMPT = (
    "You write the working memory of a long conversation between a person and an assistant that "
    "uses tools. Summarize what was asked, what was done and found (files, commands, results), "
    "decisions and their reasons, and what remains open, so the conversation can continue from the "
    "summary alone. Be concrete and brief; keep names, paths and numbers exact."
)
SUMMARY_REQUEST = "Summarize the conversation above for your own later use."
BRANCH_SUMMARY_REQUEST = ("Summarize the conversation above: it is a branch the person is leaving, and the "
                          "summary is all that will be kept of it.")


@dataclass(frozen=True)
class CompactionPlan:
    """Summarize `summarized`, keep `kept` verbatim after the summary; `tokens_before` is the
    estimated size of the whole context before compaction."""

    summarized: tuple[Message, ...]
    kept: tuple[Message, ...]
    tokens_before: int


def plan_compaction(entries: Sequence[Entry], keep_recent_tokens: int) -> CompactionPlan | None:
    """Cut the branch's context so that about `keep_recent_tokens` of the newest messages are
    kept (always at least the latest turn), starting at a user message so no kept tool result
    loses its call. None when there is nothing before the cut to summarize."""
    messages = context_messages(entries)
    kept_tokens, cut = 0, len(messages)
    while cut > 0 and kept_tokens + estimate_tokens(messages[cut - 1:cut]) <= keep_recent_tokens:
        cut -= 1
        kept_tokens += estimate_tokens(messages[cut:cut + 1])
    while cut < len(messages) and not isinstance(messages[cut], UserMessage):
        cut += 1
    # The latest turn (from the last user message on) is always kept: the model must see what it
    # is answering, however long the turn is.
    users = [i for i, message in enumerate(messages) if isinstance(message, UserMessage)]
    if users:
        cut = min(cut, users[-1])
    if cut == 0:
        return None
    return CompactionPlan(tuple(messages[:cut]), tuple(messages[cut:]), estimate_tokens(messages))


def summary_request(messages: Sequence[Message], instruction: str, custom_instructions: str | None,
                    room_tokens: int) -> ProviderRequest:
    """The request that asks a model for a summary of `messages`, within `room_tokens` (the
    model's window less the reply's reserve): when they do not fit, their longest texts are
    cut in the middle (`clip_to_room`), so one oversized entry cannot make every compaction
    overflow."""
    text = instruction if not custom_instructions else f"{instruction}\n\n{custom_instructions}"
    ask = UserMessage(content=text)
    room = room_tokens - estimate_tokens([ask], SUMMARY_SYSTEM_PROMPT)
    return ProviderRequest(system_prompt=SUMMARY_SYSTEM_PROMPT, messages=(*clip_to_room(messages, room), ask))


CUT_MARK = "\n[… {count:,} characters left out here to fit the model's context window …]\n"
_MARK_CHARS = len(CUT_MARK.format(count=10**9)) + 8  # the mark and its JSON escapes


def clip_to_room(messages: Sequence[Message], room_tokens: int) -> tuple[Message, ...]:
    """`messages` unchanged if their estimate fits `room_tokens`; else with every text longer
    than one common length cut to it, keeping its beginning and end around a `CUT_MARK`. The
    length is the longest that frees enough room, so short texts stay whole. Thinking and tool
    call arguments are never cut (a provider checks signed thinking)."""
    excess = (estimate_tokens(messages) - room_tokens) * 4
    if excess <= 0:
        return tuple(messages)
    lengths = [len(piece) for message in messages for piece in _texts(message)]

    def freed(cap: int) -> int:
        return sum(length - cap - _MARK_CHARS for length in lengths if length - cap > _MARK_CHARS)

    low, high = 0, max(lengths, default=0)  # the longest cap that still frees `excess`
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if freed(middle) >= excess else (low, middle - 1)
    return tuple(_clipped(message, low) for message in messages)


def _texts(message: Message) -> list[str]:
    content = message.content
    if isinstance(content, str):
        return [content]
    return [block.text for block in content if isinstance(block, TextContent)]


def _clipped(message: Message, cap: int) -> Message:
    def cut(text: str) -> str:
        if len(text) - cap <= _MARK_CHARS:
            return text
        head = cap * 2 // 3
        return text[:head] + CUT_MARK.format(count=len(text) - cap) + text[len(text) - (cap - head):]

    content = message.content
    if isinstance(content, str):
        return message.model_copy(update={"content": cut(content)})
    blocks = [block.model_copy(update={"text": cut(block.text)}) if isinstance(block, TextContent) else block
              for block in content]
    return message.model_copy(update={"content": blocks})
