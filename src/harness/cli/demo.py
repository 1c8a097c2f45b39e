"""The demo conversation `harness demo` writes: a short real journal with a tool call."""

from __future__ import annotations

from harness.context import Context
from harness.messages import (
    AssistantMessage,
    ModelIdentity,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from harness.session import LaneConfig, MessagePayload, Session, SessionMutator, Store, addresses

DEMO_MODEL = ModelIdentity(provider="demo", model_id="scripted")


def _reply(content: list[TextContent | ToolCall], stop_reason: str) -> AssistantMessage:
    return AssistantMessage.model_validate(
        {"content": content, "api": "demo", "provider": DEMO_MODEL.provider, "model": DEMO_MODEL.model_id,
         "stop_reason": stop_reason}
    )


async def write_demo_conversation(store: Store, context: Context) -> Session:
    """Create a session with lane `main` holding one user turn, a tool call with its result and
    the final reply, each committed as its own transaction, as a live run would."""
    session = await store.create_session(context)
    await session.create_lane("main", LaneConfig(model=DEMO_MODEL), context)
    call = ToolCall(id="call-1", name="clock", arguments={"zone": "UTC"})
    turn = [
        UserMessage(content="What time is it in UTC?"),
        _reply([TextContent(text="Let me look at the clock."), call], "tool_use"),
        ToolResultMessage(tool_call_id=call.id, tool_name=call.name,
                          content=[TextContent(text="12:00 UTC")], details={"zone": "UTC"}),
        _reply([TextContent(text="It is noon in UTC.")], "stop"),
    ]
    for message in turn:
        async def append(m: SessionMutator, message: object = message) -> None:
            tip = await m.get(addresses.branch_tip("main"), context)
            entry_id = m.insert_entry(MessagePayload.model_validate({"message": message}), parent_id=tip)
            m.set(addresses.branch_tip("main"), entry_id)

        await session.mutate(append, context)
    await session.mutate(lambda m: _name(m, "demo: what time is it"), context)
    return session


async def _name(m: SessionMutator, name: str) -> None:
    m.set(addresses.session_name(), name)
