"""Builders shared by the conversation tests: a service on the faux provider, and readers of a
conversation's transcript and chat-event rows as a fresh watch shows them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from harness.context import Context
from harness.conversation import ChatEventDetails, Conversation, ConversationService, ConversationSetup, chat_event_of
from harness.messages import Message
from harness.providers import FAUX_MODEL, FauxProvider, Model, ModelRegistry
from harness.providers.faux import FauxScript
from harness.runtime import AgentTool, DriveSettings
from harness.session import CustomMessagePayload, MessagePayload, Store


class OffersTool(Protocol):
    """A test's tool: `ProbeTool` and the like, each offering its `AgentTool`."""

    @property
    def tool(self) -> AgentTool: ...


def faux_service(store: Store, script: FauxScript, *, tools: Sequence[OffersTool] = (),
                 models: Sequence[Model] = (), setup: ConversationSetup | None = None,
                 ) -> tuple[ConversationService, FauxProvider]:
    """A service whose registry holds the faux model (and `models`, served by the same faux
    provider) answering `script`, with `tools`; frames unpaced unless `setup` says otherwise."""
    faux = FauxProvider(script)
    registry = ModelRegistry([FAUX_MODEL, *models], providers={"faux": faux})
    base = setup or ConversationSetup(drive=DriveSettings(frame_interval_s=0))
    return ConversationService(store, replace(base, models=registry, tools=[probe.tool for probe in tools])), faux


async def transcript(conversation: Conversation, ctx: Context) -> list[Message]:
    """The messages on the conversation's branch (custom entries left out)."""
    watch = await conversation.watch(ctx)
    watch.close()
    return [entry.payload.message for entry in watch.snapshot.transcript
            if isinstance(entry.payload, MessagePayload | CustomMessagePayload)]


def rows_of(messages: Sequence[Message]) -> list[ChatEventDetails]:
    """The chat-event details among `messages`, in order."""
    return [details for message in messages if (details := chat_event_of(message)) is not None]


async def rows(conversation: Conversation, ctx: Context) -> list[ChatEventDetails]:
    """The chat-event rows on the conversation's branch."""
    return rows_of(await transcript(conversation, ctx))
