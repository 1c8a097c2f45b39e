"""Messages a garden speaks into a conversation: sender `garden`, a journal message the model
reads, shown by every surface as coming from the garden and never as the person's or the model's
(OM-4, OM-5).

A garden message is a `custom_message` entry of custom type `harness.garden-message`. Its
`details` carry who sent it, why (`kind`) and the id of the emission it belongs to, so a retried
emission finds the message it already appended instead of appending a second one; its `content` is
the text the model reads, rendered once at write time.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, ValidationError

from harness.conversation.chat_events import logger
from harness.messages import CleanStr, CustomMessage, Message

GARDEN_MESSAGE_TYPE = "harness.garden-message"
"""The custom type of every garden message entry."""

GardenMessageKind: TypeAlias = Literal["tend_survey", "recently_concluded", "reply"]
"""Why a garden speaks: one of its two operator notes (OM-1), or the answer of a converse goal."""

_KIND_WORDS: dict[GardenMessageKind, str] = {
    "tend_survey": "a survey from its latest tending",
    "recently_concluded": "a goal it recently concluded",
    "reply": "its answer",
}


class GardenMessage(BaseModel):
    """The details of one garden message: the garden, the kind, the emission, goal and run it
    came from, and the text a person reads."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    v: Literal[1] = 1
    sender: Literal["garden"] = "garden"
    garden: CleanStr
    kind: GardenMessageKind
    emission_id: CleanStr
    goal_id: CleanStr
    run_id: CleanStr
    text: CleanStr


def garden_message(details: GardenMessage) -> CustomMessage:
    """The journal message of `details`: the model reads who speaks, about what, then the text."""
    content = f"[The garden {details.garden} writes about {_KIND_WORDS[details.kind]}:]\n{details.text}"
    return CustomMessage(custom_type=GARDEN_MESSAGE_TYPE, content=content, details=details.model_dump(mode="json"))


def garden_message_of(message: Message | None) -> GardenMessage | None:
    """The details of `message` if it is a garden message this version can read; an unknown shape
    is logged and reads as None, so a surface shows nothing for it."""
    if not isinstance(message, CustomMessage) or message.custom_type != GARDEN_MESSAGE_TYPE:
        return None
    try:
        return GardenMessage.model_validate(message.details)
    except ValidationError as error:
        logger.error("a garden message with details this version does not know: %s", error.errors()[0]["msg"])
        return None
