"""What a compaction or a branch summary sends and keeps: token estimates, the cut point, the
summary request."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.messages import Message, UserMessage
from harness.providers import ProviderRequest
from harness.runtime.branch_context import context_messages
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


def estimate_tokens(messages: Sequence[Message]) -> int:
    """A rough token count (four characters per token) of what `messages` send."""
    return sum(len(message.model_dump_json()) for message in messages) // 4


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


def summary_request(messages: Sequence[Message], instruction: str, custom_instructions: str | None) -> ProviderRequest:
    """The request that asks a model for a summary of `messages`."""
    text = instruction if not custom_instructions else f"{instruction}\n\n{custom_instructions}"
    return ProviderRequest(system_prompt=SUMMARY_SYSTEM_PROMPT,
                           messages=(*messages, UserMessage(content=text)))
