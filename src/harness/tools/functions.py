"""Tools from typed functions: a plain function (sync or async) with type hints and a docstring
becomes an `AgentTool`. Its arguments' JSON Schema comes from its signature through pydantic, its
description and each argument's from its docstring (Google, NumPy, reST or Epydoc style, read by
`docstring_parser`), and the model's arguments are validated into the annotated types before it
runs: a validation error is an error result the model reads, with pydantic's words."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, ParamSpec, TypeVar, overload

import docstring_parser
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, create_model
from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import to_json

from harness.context import Context
from harness.errors import HarnessError
from harness.messages import TextContent
from harness.providers import ToolSpec
from harness.runtime import AgentTool, ProgressCallback, ToolOutput

P = ParamSpec("P")
R = TypeVar("R")

Replay = Literal["never", "safe"]
"""Whether a call a crash interrupted runs again (`"safe"`: a read) or is answered with an
interruption result instead (`"never"`, the default: it may have changed something, HA-25)."""


class ToolSignatureInvalid(HarnessError):
    """A function cannot be a tool as it is written: a parameter without a type hint, `*args` or
    `**kwargs`, or a type pydantic cannot describe as JSON Schema; details `{tool, parameter?}`."""

    code = "tool_signature_invalid"


@dataclass(frozen=True)
class FunctionTool:
    """A typed function offered to the model: `agent_tool` is what the harness runs (its spec
    from the signature and docstring, its `replay` rule, and `asks_first` when a call waits for
    someone to allow it). Calling it calls the function, so a decorated function stays usable as
    one."""

    function: Callable[..., Any]
    agent_tool: AgentTool

    @property
    def name(self) -> str:
        return self.agent_tool.name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)


@overload
def tool(function: Callable[P, R], /) -> FunctionTool: ...


@overload
def tool(*, name: str | None = None, replay: Replay = "never",
         approval: bool = False) -> Callable[[Callable[P, R]], FunctionTool]: ...


def tool(function: Callable[P, R] | None = None, /, *, name: str | None = None, replay: Replay = "never",
         approval: bool = False) -> FunctionTool | Callable[[Callable[P, R]], FunctionTool]:
    """Make a typed function a tool (`function_tool`), as `@tool` or `@tool(replay="safe",
    approval=True)`: `replay="safe"` for a read that may run again after a crash (the default
    `"never"` answers an interrupted call with an interruption result instead), `approval` for a
    call that waits for someone to allow it (`AgentTool.asks_first`). Raises `ToolSignatureInvalid`."""
    if function is not None:
        return function_tool(function, name=name, replay=replay, approval=approval)
    return functools.partial(function_tool, name=name, replay=replay, approval=approval)


def function_tool(function: Callable[..., Any], *, name: str | None = None, description: str | None = None,
                  replay: Replay = "never", approval: bool = False) -> FunctionTool:
    """`function` as a tool named `name` (default: the function's name).

    Each parameter is an argument the model gives, typed by its annotation (any type pydantic
    validates: numbers, strings, enums, `Literal`s, dates, nested models, lists) and described by
    its docstring's entry; one annotated `Context` instead receives the call's Context and is not
    shown to the model. The description is the docstring's text without its parameter section
    (default: none). An async function is awaited; a sync one runs in a worker thread, so it does
    not hold up the event loop. What it returns becomes the result: a `ToolOutput` as it is, a
    string as text, anything else as JSON (`pydantic_core.to_json`). What it raises is the
    call's error result, as for any tool. Raises `ToolSignatureInvalid`."""
    tool_name = name or function.__name__
    docs = docstring_parser.parse(inspect.getdoc(function) or "")
    arguments, context_parameter = _arguments_model(function, tool_name, docs)
    schema = arguments.model_json_schema(schema_generator=_Untitled)
    schema.pop("title", None)
    about = "\n\n".join(part for part in (docs.short_description, docs.long_description) if part)
    spec = ToolSpec(name=tool_name, description=description if description is not None else about,
                    parameters=schema)
    call = _caller(function)

    async def execute(tool_call_id: str, args: dict[str, JsonValue], on_update: ProgressCallback,
                      context: Context) -> ToolOutput:
        try:
            given = arguments.model_validate(args)
        except ValidationError as error:
            return ToolOutput(content=[TextContent(text=invalid_arguments_text(tool_name, error))], is_error=True)
        values = {field.alias: getattr(given, name) for name, field in arguments.model_fields.items()
                  if field.alias is not None}
        if context_parameter is not None:
            values[context_parameter] = context
        return _output(await call(values))

    return FunctionTool(function, AgentTool(spec=spec, execute=execute, replay=replay, asks_first=approval))


def invalid_arguments_text(tool_name: str, error: ValidationError) -> str:
    """What the model reads when its arguments do not validate: one line per problem, each with
    the argument's path and pydantic's message."""
    lines = [f"{'.'.join(str(part) for part in problem['loc']) or 'arguments'}: {problem['msg']}"
             for problem in error.errors(include_url=False)]
    return f"invalid arguments for {tool_name}:\n" + "\n".join(lines)


class _Untitled(GenerateJsonSchema):
    """JSON Schema without the titles pydantic derives from field names: the model reads each
    property's name already, and every title is tokens in every request."""

    def field_title_should_be_set(self, schema: object) -> bool:
        return False


def _arguments_model(function: Callable[..., Any], tool_name: str,
                     docs: docstring_parser.Docstring) -> tuple[type[BaseModel], str | None]:
    """A pydantic model of `function`'s parameters, and the name of its `Context` parameter."""
    try:
        signature = inspect.signature(function, eval_str=True)
    except (NameError, TypeError) as error:  # a hint naming what the function's module does not have
        raise ToolSignatureInvalid(f"the type hints of tool {tool_name} cannot be read: {error}",
                                   tool=tool_name) from error
    described = {param.arg_name: param.description for param in docs.params if param.description}
    fields: dict[str, Any] = {}
    context_parameter = None
    for parameter in signature.parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise ToolSignatureInvalid(f"tool {tool_name} takes *{parameter.name}: the model gives named arguments "
                                       "only", tool=tool_name, parameter=parameter.name)
        if parameter.annotation is inspect.Parameter.empty:
            raise ToolSignatureInvalid(f"parameter {parameter.name} of tool {tool_name} has no type hint",
                                       tool=tool_name, parameter=parameter.name)
        if parameter.annotation is Context:
            context_parameter = parameter.name
            continue
        default = ... if parameter.default is inspect.Parameter.empty else parameter.default
        # Fields by position, named by alias: a parameter may be called `json` or `schema`, which
        # would shadow the model's own attributes, or start with `_`, which pydantic ignores.
        fields[f"p{len(fields)}"] = (parameter.annotation, Field(default, alias=parameter.name,
                                                                 description=described.get(parameter.name)))
    try:
        model = create_model(f"{tool_name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
        model.model_json_schema(schema_generator=_Untitled)
    except Exception as error:  # pydantic's errors for types it cannot validate or describe vary
        raise ToolSignatureInvalid(f"tool {tool_name} has an argument pydantic cannot describe: {error}",
                                   tool=tool_name) from error
    return model, context_parameter


def _caller(function: Callable[..., Any]) -> Callable[[dict[str, Any]], Awaitable[Any]]:
    if inspect.iscoroutinefunction(function):
        async def awaited(values: dict[str, Any]) -> Any:
            return await function(**values)
        return awaited

    async def threaded(values: dict[str, Any]) -> Any:
        return await asyncio.to_thread(function, **values)
    return threaded


def _output(value: object) -> ToolOutput:
    if isinstance(value, ToolOutput):
        return value
    text = value if isinstance(value, str) else to_json(value).decode()
    return ToolOutput(content=[TextContent(text=text)])
