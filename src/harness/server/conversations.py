"""The REST routes of every conversation door: conversations, turns, commands, approvals, the
display read and images. Each goes through the one `ConversationService` of the server, as the
current user; another user's conversation answers exactly like a missing one (404)."""

from __future__ import annotations

from fastapi import APIRouter, status
from pydantic import BaseModel, ConfigDict, Field

from harness.conversation import ConversationInfo
from harness.messages import ModelIdentity
from harness.server.state import CurrentUser, RequestContext, State

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
    name: str | None = Field(default=None, max_length=200, description="The conversation's name; none: unnamed.")
    model: ModelIdentity | None = Field(default=None, description="Its model; none: the server's default.")


@router.post("/conversations", status_code=status.HTTP_201_CREATED, response_model=ConversationOut)
async def create_conversation(body: CreateConversation, user: CurrentUser, state: State,
                              context: RequestContext) -> ConversationOut:
    """A new conversation of the current user, live in this server."""
    conversation = await state.service.create(user, state.new_lane(body.model), context, name=body.name)
    return ConversationOut.of(conversation.info)


@router.get("/conversations", response_model=list[ConversationOut])
async def list_conversations(user: CurrentUser, state: State, context: RequestContext) -> list[ConversationOut]:
    """The current user's conversations, most recently updated first."""
    return [ConversationOut.of(info) for info in await state.service.list(user, context)]
