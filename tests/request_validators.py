"""Validators of built provider requests, one per API, written from each API's documented rules.

Each takes the keyword arguments an adapter's `build_request_params` returns (the request body plus
the SDK's `extra_*` arguments) and the `Model` it was built for, and returns the broken rules as
`"<where>: <rule>"` lines (none when the request is valid). `problems(api, params, model)` picks the
validator by api name.

What they check, per API:

- Anthropic Messages (`anthropic-messages`): roles alternate; content is never empty and text blocks
  are never blank; every `tool_use` is answered by a `tool_result` in the very next (user) turn, and
  that turn's `tool_result` blocks come before anything else; a `tool_result` refers to a
  `tool_use` of the turn just before it, once; `tool_use` ids match `^[a-zA-Z0-9_-]+$` and are
  unique; a thinking block has a non-empty signature, a redacted one non-empty data; images are
  base64 in jpeg/png/gif/webp and only for a model that reads images; a thinking budget is at least
  1,024 and below `max_tokens`, comes without a temperature, and, when the request answers tool
  calls, the turn that made them starts with thinking; at most 4 cache breakpoints.
- OpenAI Chat Completions (`openai-chat`): an assistant message with `tool_calls` is followed
  directly by one `tool` message per call id before any other message; a `tool` message answers a
  call of that assistant message, once; call arguments are strings holding a JSON object; user
  content is not empty; image parts only in user messages and only for a model that reads images.
- OpenAI Responses (`openai-responses`): every `function_call` is answered by a
  `function_call_output` directly after the run of output items it belongs to, before any other
  input; an output answers a call of that run, once; arguments are strings holding a JSON object;
  reasoning items carry `encrypted_content`, are sent with `store=False` (and a reasoning model asks
  for `reasoning.encrypted_content`), and are followed by the item they came before; images only
  for a model that reads images.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from harness.providers import Model, ProviderRequest, StreamOptions
from harness.providers import anthropic_messages as anthropic_adapter
from harness.providers import openai_chat as chat_adapter
from harness.providers import openai_responses as responses_adapter

_ANTHROPIC_TOOL_ID = re.compile(r"[a-zA-Z0-9_-]+")
_ANTHROPIC_IMAGE_TYPES = {"image/jpeg", "image/png", "image/gif", "image/webp"}
_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_MAX_CACHE_BREAKPOINTS = 4


def problems(api: str, params: Mapping[str, Any], model: Model) -> list[str]:
    """The rules `params` breaks for `api`; raises KeyError for an api without a validator."""
    return VALIDATORS[api](params, model)


# The model each built request is validated for, one per wire format.
BUILDERS: dict[str, tuple[Model, Callable[[Model, ProviderRequest, StreamOptions], dict[str, Any]]]] = {
    "anthropic-messages": (
        Model(id="claude-sonnet-4-5", provider="anthropic", api="anthropic-messages", max_tokens=64_000),
        anthropic_adapter.build_request_params,
    ),
    "openai-chat": (Model(id="gpt-4o", provider="openai", api="openai-chat"), chat_adapter.build_request_params),
    "openai-responses": (
        Model(id="gpt-5", provider="openai", api="openai-responses"), responses_adapter.build_request_params,
    ),
}


def assert_valid_everywhere(request: ProviderRequest) -> None:
    """`request` built for each of the three wire formats breaks none of its rules."""
    for api, (model, build) in BUILDERS.items():
        params = build(model, request, StreamOptions())
        assert problems(api, params, model) == [], f"{api}: {problems(api, params, model)}"


def anthropic_messages(params: Mapping[str, Any], model: Model) -> list[str]:
    """The rules an Anthropic Messages request breaks (see the module docstring)."""
    found: list[str] = []
    messages = params.get("messages")
    if not isinstance(params.get("model"), str) or not params["model"]:
        found.append("model: must be a non-empty string")
    max_tokens = params.get("max_tokens")
    if not isinstance(max_tokens, int) or max_tokens < 1:
        found.append("max_tokens: must be a positive integer")
    if not isinstance(messages, list) or not messages:
        return [*found, "messages: must be a non-empty list"]
    found += _anthropic_system(params.get("system"))
    found += _anthropic_tools(params.get("tools"))
    seen_tool_ids: set[str] = set()
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = message.get("role")
        if role not in ("user", "assistant"):
            found.append(f"{where}.role: must be user or assistant, not {role!r}")
            continue
        if i > 0 and messages[i - 1].get("role") == role:
            found.append(f"{where}: two {role} turns in a row (roles must alternate)")
        blocks = _anthropic_blocks(message.get("content"))
        if not blocks:
            found.append(f"{where}.content: must not be empty")
            continue
        for j, block in enumerate(blocks):
            found += _anthropic_block(f"{where}.content[{j}]", role, block, model, seen_tool_ids)
        if role == "assistant":
            found += _anthropic_answers(messages, i)
        else:
            found += _anthropic_results_refer_back(messages, i)
    found += _anthropic_thinking(params, messages)
    breakpoints = json.dumps(params, default=str).count('"cache_control"')
    if breakpoints > _MAX_CACHE_BREAKPOINTS:
        found.append(f"cache_control: {breakpoints} breakpoints, at most {_MAX_CACHE_BREAKPOINTS} are allowed")
    return found


def _anthropic_blocks(content: object) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content) if isinstance(content, list) else []


def _anthropic_system(system: object) -> list[str]:
    if system is None or (isinstance(system, str) and system.strip()):
        return []
    if isinstance(system, list) and system and all(
        isinstance(block, dict) and block.get("type") == "text" and _has_text(block.get("text")) for block in system
    ):
        return []
    return ["system: must be a non-blank string or a list of non-blank text blocks"]


def _anthropic_tools(tools: object) -> list[str]:
    found: list[str] = []
    for k, tool in enumerate(tools if isinstance(tools, list) else []):
        if not isinstance(tool.get("name"), str) or not _TOOL_NAME.fullmatch(tool["name"]):
            found.append(f"tools[{k}].name: must match ^[a-zA-Z0-9_-]{{1,64}}$")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict) or schema.get("type") != "object":
            found.append(f"tools[{k}].input_schema: must be a JSON Schema of type object")
    return found


def _anthropic_block(
    where: str, role: str, block: Mapping[str, Any], model: Model, seen_tool_ids: set[str]
) -> list[str]:
    kind = block.get("type")
    allowed = ("text", "thinking", "redacted_thinking", "tool_use") if role == "assistant" else (
        "text", "image", "tool_result"
    )
    if kind not in allowed:
        return [f"{where}: a {role} turn cannot hold a {kind!r} block"]
    match kind:
        case "text":
            return [] if _has_text(block.get("text")) else [f"{where}: text blocks must not be blank"]
        case "thinking":
            if not isinstance(block.get("signature"), str) or not block["signature"]:
                return [f"{where}: a thinking block needs its non-empty signature"]
            return [] if isinstance(block.get("thinking"), str) else [f"{where}.thinking: must be a string"]
        case "redacted_thinking":
            data = block.get("data")
            return [] if isinstance(data, str) and data else [f"{where}: redacted thinking needs its data"]
        case "tool_use":
            found: list[str] = []
            call_id = block.get("id")
            if not isinstance(call_id, str) or not _ANTHROPIC_TOOL_ID.fullmatch(call_id):
                found.append(f"{where}.id: {call_id!r} does not match ^[a-zA-Z0-9_-]+$")
            elif call_id in seen_tool_ids:
                found.append(f"{where}.id: tool_use ids must be unique, {call_id!r} repeats")
            else:
                seen_tool_ids.add(call_id)
            if not isinstance(block.get("input"), dict):
                found.append(f"{where}.input: must be an object")
            if not isinstance(block.get("name"), str) or not block["name"]:
                found.append(f"{where}.name: must be a non-empty string")
            return found
        case "image":
            return _anthropic_image(where, block, model)
        case _:  # tool_result
            content = block.get("content", [])
            if isinstance(content, str):
                return []
            found = []
            for k, part in enumerate(content if isinstance(content, list) else [None]):
                if not isinstance(part, dict) or part.get("type") not in ("text", "image"):
                    found.append(f"{where}.content[{k}]: a tool result holds text and image blocks only")
                elif part["type"] == "text" and not _has_text(part.get("text")):
                    found.append(f"{where}.content[{k}]: text blocks must not be blank")
                elif part["type"] == "image":
                    found += _anthropic_image(f"{where}.content[{k}]", part, model)
            return found


def _anthropic_image(where: str, block: Mapping[str, Any], model: Model) -> list[str]:
    found = [] if "image" in model.input else [f"{where}: {model.id} does not read images"]
    source = block.get("source")
    if not isinstance(source, dict) or source.get("type") != "base64" or not source.get("data"):
        found.append(f"{where}.source: must be base64 data")
    elif source.get("media_type") not in _ANTHROPIC_IMAGE_TYPES:
        found.append(f"{where}.source.media_type: {source.get('media_type')!r} is not jpeg, png, gif or webp")
    return found


def _anthropic_answers(messages: Sequence[Mapping[str, Any]], i: int) -> list[str]:
    """Every tool_use of assistant turn `i` is answered at the start of the next turn."""
    calls = [b["id"] for b in _anthropic_blocks(messages[i]["content"]) if b.get("type") == "tool_use"]
    if not calls:
        return []
    where = f"messages[{i}]"
    if i + 1 >= len(messages) or messages[i + 1].get("role") != "user":
        return [f"{where}: tool_use ids {calls} have no tool_result in the next (user) turn"]
    following = _anthropic_blocks(messages[i + 1]["content"])
    leading: list[str] = []
    for block in following:
        if block.get("type") != "tool_result":
            break
        leading.append(block.get("tool_use_id", ""))
    found = []
    if missing := [call for call in calls if call not in leading]:
        found.append(f"{where}: tool_use ids {missing} are not answered by tool_result blocks first in the next turn")
    later = [b.get("tool_use_id") for b in following[len(leading):] if b.get("type") == "tool_result"]
    if later:
        found.append(f"messages[{i + 1}]: tool_result blocks {later} come after other content")
    return found


def _anthropic_results_refer_back(messages: Sequence[Mapping[str, Any]], i: int) -> list[str]:
    """Every tool_result of user turn `i` answers a tool_use of the turn just before, once."""
    blocks = _anthropic_blocks(messages[i]["content"])
    results = [block.get("tool_use_id") for block in blocks if block.get("type") == "tool_result"]
    if not results:
        return []
    previous = _anthropic_blocks(messages[i - 1]["content"]) if i > 0 else []
    calls = {b.get("id") for b in previous if b.get("type") == "tool_use"}
    found = [f"messages[{i}]: tool_result {r!r} answers no tool_use of the turn before" for r in results
             if r not in calls]
    if len(set(results)) != len(results):
        found.append(f"messages[{i}]: a tool_use is answered more than once in {results}")
    return found


def _anthropic_thinking(params: Mapping[str, Any], messages: Sequence[Mapping[str, Any]]) -> list[str]:
    thinking = params.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") != "enabled":
        return []
    found: list[str] = []
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or budget < 1024 or budget >= params["max_tokens"]:
        found.append(f"thinking.budget_tokens: {budget!r} must be at least 1024 and below max_tokens")
    temperature = {**params, **params.get("extra_body", {})}.get("temperature")
    if temperature is not None and temperature != 1:
        found.append("temperature: thinking allows only the default temperature")
    last = _anthropic_blocks(messages[-1]["content"])
    if len(messages) >= 2 and any(b.get("type") == "tool_result" for b in last):
        first = _anthropic_blocks(messages[-2]["content"])[:1]
        if not first or first[0].get("type") not in ("thinking", "redacted_thinking"):
            found.append("thinking: the assistant turn whose tool results end the request must start with thinking")
    return found


def openai_chat(params: Mapping[str, Any], model: Model) -> list[str]:
    """The rules a Chat Completions request breaks (see the module docstring)."""
    messages = params.get("messages")
    if not isinstance(messages, list) or not messages:
        return ["messages: must be a non-empty list"]
    found = _openai_tools(params.get("tools"), nested=True)
    waiting: list[str] = []  # call ids of the last assistant message not answered yet
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = message.get("role")
        if role != "tool" and waiting:
            found.append(f"{where}: tool_call ids {waiting} must be answered by tool messages before a {role} message")
            waiting = []
        match role:
            case "system" | "developer":
                if not _has_text(message.get("content")):
                    found.append(f"{where}.content: must be a non-blank string")
            case "user":
                found += _openai_parts(where, message.get("content"), model, text_type="text", image_type="image_url")
            case "assistant":
                calls = message.get("tool_calls") or []
                content = message.get("content")
                if not calls and not _has_text(content) and not (isinstance(content, list) and content):
                    found.append(f"{where}: an assistant message needs content or tool_calls")
                if isinstance(content, list) and any(part.get("type") != "text" for part in content):
                    found.append(f"{where}.content: an assistant message holds text parts only")
                ids = [call.get("id") for call in calls]
                if len(set(ids)) != len(ids):
                    found.append(f"{where}.tool_calls: ids repeat: {ids}")
                for k, call in enumerate(calls):
                    found += _openai_call(f"{where}.tool_calls[{k}]", call)
                waiting = [call_id for call_id in ids if isinstance(call_id, str)]
            case "tool":
                call_id = message.get("tool_call_id")
                if call_id in waiting:
                    waiting.remove(call_id)
                else:
                    found.append(f"{where}: tool message for {call_id!r} answers no waiting call just before it")
                content = message.get("content")
                if not isinstance(content, str) and not (
                    isinstance(content, list) and all(part.get("type") == "text" for part in content)
                ):
                    found.append(f"{where}.content: a tool message holds a string or text parts")
            case _:
                found.append(f"{where}.role: {role!r} is not a Chat Completions role")
    if waiting:
        found.append(f"messages: tool_call ids {waiting} are never answered")
    return found


def openai_responses(params: Mapping[str, Any], model: Model) -> list[str]:
    """The rules a Responses request breaks (see the module docstring)."""
    items = params.get("input")
    if not isinstance(items, list) or not items:
        return ["input: must be a non-empty list"]
    found = _openai_tools(params.get("tools"), nested=False)
    if model.reasoning and params.get("store") is False and "reasoning.encrypted_content" not in params.get(
        "include", []
    ):
        found.append("include: a reasoning model with store=false must ask for reasoning.encrypted_content")
    run_calls: set[str] = set()  # call ids of the current run of output items (one reply)
    waiting: list[str] = []  # of those, the ones not answered yet
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if _responses_is_output(item):
            if i > 0 and not _responses_is_output(items[i - 1]):
                run_calls = set()  # a new reply begins
            if waiting and items[i - 1].get("type") == "function_call_output":
                found.append(f"{where}: function calls {waiting} must be answered before the next reply")
                waiting = []
        elif kind != "function_call_output" and waiting:
            found.append(f"{where}: function calls {waiting} must be answered before other input")
            waiting = []
        match kind:
            case "message":
                role = item.get("role")
                if role == "assistant":
                    found += _openai_parts(where, item.get("content"), model, text_type="output_text", image_type=None)
                elif role in ("user", "system", "developer"):
                    found += _openai_parts(
                        where, item.get("content"), model, text_type="input_text", image_type="input_image"
                    )
                else:
                    found.append(f"{where}.role: {role!r} is not a Responses message role")
            case "function_call":
                found += _openai_arguments(f"{where}.arguments", item.get("arguments"))
                call_id = item.get("call_id")
                if not isinstance(call_id, str) or not call_id:
                    found.append(f"{where}.call_id: must be a non-empty string")
                elif call_id in run_calls:
                    found.append(f"{where}.call_id: {call_id!r} repeats")
                else:
                    run_calls.add(call_id)
                    waiting.append(call_id)
            case "function_call_output":
                call_id = item.get("call_id")
                if call_id in waiting:
                    waiting.remove(call_id)
                else:
                    found.append(f"{where}: output for {call_id!r} answers no waiting function_call just before it")
                output = item.get("output")
                if isinstance(output, list):
                    found += _openai_parts(f"{where}.output", output, model, text_type="input_text",
                                           image_type="input_image", allow_empty=True)
                elif not isinstance(output, str):
                    found.append(f"{where}.output: must be a string or input parts")
            case "reasoning":
                if params.get("store") is not False:
                    found.append(f"{where}: reasoning is replayed only with store=false")
                if not isinstance(item.get("encrypted_content"), str) or not item["encrypted_content"]:
                    found.append(f"{where}: a reasoning item needs its encrypted_content")
                if not isinstance(item.get("summary"), list):
                    found.append(f"{where}.summary: must be a list")
                if i + 1 >= len(items) or not _responses_is_output(items[i + 1]):
                    found.append(f"{where}: a reasoning item must be followed by the item it came before")
            case _:
                found.append(f"{where}.type: {kind!r} is not an input item these adapters send")
    if waiting:
        found.append(f"input: function calls {waiting} are never answered")
    return found


def _responses_is_output(item: Mapping[str, Any]) -> bool:
    kind = item.get("type", "message")
    return kind in ("function_call", "reasoning") or (kind == "message" and item.get("role") == "assistant")


def _openai_tools(tools: object, *, nested: bool) -> list[str]:
    found: list[str] = []
    for k, tool in enumerate(tools if isinstance(tools, list) else []):
        spec = tool.get("function", {}) if nested else tool
        if tool.get("type") != "function":
            found.append(f"tools[{k}].type: must be function")
        if not isinstance(spec.get("name"), str) or not _TOOL_NAME.fullmatch(spec["name"]):
            found.append(f"tools[{k}].name: must match ^[a-zA-Z0-9_-]{{1,64}}$")
        if not isinstance(spec.get("parameters"), dict):
            found.append(f"tools[{k}].parameters: must be a JSON Schema object")
    return found


def _openai_call(where: str, call: Mapping[str, Any]) -> list[str]:
    found: list[str] = []
    if not isinstance(call.get("id"), str) or not call["id"]:
        found.append(f"{where}.id: must be a non-empty string")
    if call.get("type") != "function":
        found.append(f"{where}.type: must be function")
    function = call.get("function") or {}
    if not isinstance(function.get("name"), str) or not function["name"]:
        found.append(f"{where}.function.name: must be a non-empty string")
    return found + _openai_arguments(f"{where}.function.arguments", function.get("arguments"))


def _openai_arguments(where: str, arguments: object) -> list[str]:
    if not isinstance(arguments, str):
        return [f"{where}: must be a string of JSON"]
    try:
        value = json.loads(arguments)
    except ValueError:
        return [f"{where}: {arguments!r} is not valid JSON"]
    return [] if isinstance(value, dict) else [f"{where}: must hold a JSON object"]


def _openai_parts(
    where: str, content: object, model: Model, *, text_type: str, image_type: str | None, allow_empty: bool = False
) -> list[str]:
    if isinstance(content, str):
        return [] if content.strip() or allow_empty else [f"{where}.content: must not be blank"]
    if not isinstance(content, list) or (not content and not allow_empty):
        return [f"{where}.content: must be a non-blank string or a non-empty list of parts"]
    found: list[str] = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == text_type:
            if not _has_text(part.get("text")):
                found.append(f"{where}.content[{k}]: text parts must not be blank")
        elif image_type is not None and kind == image_type:
            if "image" not in model.input:
                found.append(f"{where}.content[{k}]: {model.id} does not read images")
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            if not isinstance(url, str) or not url.startswith(("data:image/", "https://", "http://")):
                found.append(f"{where}.content[{k}]: an image needs a data: or http(s) URL")
        else:
            found.append(f"{where}.content[{k}]: {kind!r} parts are not allowed here")
    return found


def _has_text(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())


VALIDATORS: dict[str, Callable[[Mapping[str, Any], Model], list[str]]] = {
    "anthropic-messages": anthropic_messages,
    "openai-chat": openai_chat,
    "openai-responses": openai_responses,
}
