"""Structured output (issue 32): how a request's `output` schema reaches a model.

A model with `structured_output="native"` gets it in its wire format's own field, which each
adapter fills (OpenAI's two from `openai_json_schema`, `strict` where the schema allows it). A model with
`structured_output="tool"` gets a final-answer tool instead (`structured_stream`): the schema is
that tool's arguments, the tool is forced when it is the only one, and the model's call of it comes
back as the reply's text, so every reply with an answer looks the same to the runtime, whichever
way it was asked for: JSON text, which the run validates.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from pydantic import JsonValue

from harness.context import Context
from harness.messages import AssistantMessage, OutputSchema, TextContent, ToolCall
from harness.providers.protocol import (
    DoneEvent,
    ErrorEvent,
    Model,
    Provider,
    ProviderRequest,
    StreamEvent,
    StreamOptions,
    TextDeltaEvent,
    TextEndEvent,
    TextStartEvent,
    ToolCallDeltaEvent,
    ToolCallEndEvent,
    ToolCallStartEvent,
    ToolSpec,
)

OUTPUT_TOOL_DESCRIPTION = "Give your final answer by calling this tool, the answer as its arguments."


def openai_json_schema(output: OutputSchema) -> dict[str, Any]:
    """OpenAI's `json_schema` format of `output`, as Chat Completions takes it in
    `response_format.json_schema` and the Responses API in `text.format` (beside its `type`): its
    name, schema, description when it has one, and `strict` when the schema allows it (`is_strict`)."""
    schema = output.json_schema
    answer: dict[str, Any] = {"name": output.name, "schema": schema, "strict": is_strict(schema)}
    if output.description:
        answer["description"] = output.description
    return answer


def is_strict(schema: JsonValue) -> bool:
    """Whether OpenAI's strict mode takes `schema` as it is: every object in it closed
    (`additionalProperties: false`) with every property required. Strict mode refuses any other
    schema, so one that is not is sent with `strict: false` (the model is asked, not bound)."""
    if not isinstance(schema, dict):
        return True
    properties = schema.get("properties")
    if isinstance(properties, dict) or schema.get("type") == "object":
        names = set(properties) if isinstance(properties, dict) else set()
        required = schema.get("required")
        if schema.get("additionalProperties") is not False or set(required if isinstance(required, list) else ()) \
                != names:
            return False
    for key, value in schema.items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            if not all(is_strict(each) for each in value.values()):
                return False
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            if not all(is_strict(each) for each in value):
                return False
        elif key in _SCHEMAS and not is_strict(value):
            return False
    return True


_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SCHEMA_LISTS = ("anyOf", "allOf", "oneOf", "prefixItems")
_SCHEMAS = ("items", "not", "additionalProperties")


def output_tool(output: OutputSchema) -> ToolSpec:
    """The final-answer tool of `output`: its name, its schema as the arguments."""
    return ToolSpec(name=output.name, description=output.description or OUTPUT_TOOL_DESCRIPTION,
                    parameters=output.json_schema)


def structured_stream(provider: Provider, model: Model, request: ProviderRequest, options: StreamOptions,
                      context: Context) -> AsyncIterator[StreamEvent]:
    """`provider.stream` of `request`, its `output` asked for as `model` takes it: as is for a
    native model (or a request without one), else as the final-answer tool, whose call comes back
    as text (a call with other calls beside it too: those run, and the run validates the answer
    when it would end)."""
    output = request.output
    if output is None or model.structured_output == "native":
        return provider.stream(model, request, options, context)
    asked = request.model_copy(update={"output": None, "tools": (*request.tools, output_tool(output))})
    if not request.tools and options.tool_choice is None:
        options = options.model_copy(update={"tool_choice": output.name})
    return _calls_as_text(provider.stream(model, asked, options, context), output.name)


async def _calls_as_text(events: AsyncIterator[StreamEvent], name: str) -> AsyncIterator[StreamEvent]:
    """`events` with each call of tool `name` turned into a text block of its argument JSON."""
    answers: set[int] = set()  # the content indexes of calls of `name`
    async for event in events:
        match event:
            case ToolCallStartEvent() if event.name == name:
                answers.add(event.content_index)
                yield TextStartEvent(content_index=event.content_index)
            case ToolCallDeltaEvent() if event.content_index in answers:
                yield TextDeltaEvent(content_index=event.content_index, delta=event.delta)
            case ToolCallEndEvent() if event.content_index in answers:
                yield TextEndEvent(content_index=event.content_index)
            case DoneEvent() | ErrorEvent():
                yield event.model_copy(update={"message": _answered(event.message, name)})
            case _:
                yield event


def _answered(message: AssistantMessage, name: str) -> AssistantMessage:
    if not any(isinstance(block, ToolCall) and block.name == name for block in message.content):
        return message
    content = [TextContent(text=block.raw_arguments or json.dumps(block.arguments, ensure_ascii=False))
               if isinstance(block, ToolCall) and block.name == name else block for block in message.content]
    called = any(isinstance(block, ToolCall) for block in content)
    stop = "stop" if message.stop_reason == "tool_use" and not called else message.stop_reason
    return message.model_copy(update={"content": content, "stop_reason": stop})
