"""The chat's first prompt, drawn while the rest of the chat loads (issue 33, item 13).

Loading the chat (the journal, the runtime, the conversation service and their models) takes about
a second of CPU; the prompt alone needs prompt_toolkit. So `harness chat` draws a plain prompt at
once and loads the rest in a thread meanwhile: what the person types there is handed to the
chat's own prompt once it is up, as if typed into it. Enter does nothing until then (nothing can
be sent before the conversation is attached); Ctrl-D on an empty line leaves, Ctrl-C clears the
line.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import threading
from collections.abc import Callable

from prompt_toolkit import PromptSession
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.output.vt100 import Vt100_Output
from prompt_toolkit.styles import Style

_STYLE = Style.from_dict({"prompt": "bold", "placeholder": "fg:ansibrightblack"})


def typed_while_loading(load: Callable[[], object]) -> str | None:
    """Run `load` in a thread while a prompt takes what the person types; return the text typed
    by the time it returned, or None at once when the person leaves (Ctrl-D on an empty line).
    What `load` raises is raised here, once the prompt is gone."""
    loading: concurrent.futures.Future[object] = concurrent.futures.Future()

    def run() -> None:
        try:
            loading.set_result(load())
        except BaseException as error:  # handed to the caller as is
            loading.set_exception(error)

    # A daemon: leaving from this prompt does not wait for the imports to finish.
    threading.Thread(target=run, name="harness-chat-load", daemon=True).start()
    typed = asyncio.run(_prompt_until(loading))
    if typed is not None:
        loading.result()
    return typed


async def _prompt_until(loading: concurrent.futures.Future[object]) -> str | None:
    bindings = KeyBindings()

    @bindings.add("enter")
    def _not_yet(event: KeyPressEvent) -> None:
        """Nothing is sent before the chat is up: its prompt takes the line."""

    @bindings.add("c-c")
    def _clear(event: KeyPressEvent) -> None:
        event.current_buffer.reset()

    @bindings.add("c-d")
    def _leave(event: KeyPressEvent) -> None:
        if not event.current_buffer.text:
            event.app.exit(exception=EOFError())

    # No cursor position requests: an answer still on its way when this prompt ends would be read
    # as typing by the chat's own prompt.
    output = Vt100_Output.from_pty(sys.stdout)
    output.enable_cpr = False
    session: PromptSession[str] = PromptSession(
        key_bindings=bindings, erase_when_done=True, style=_STYLE, output=output,
        placeholder=[("class:placeholder", "starting…")])
    app, up = session.app, asyncio.Event()

    async def end_when_loaded() -> None:
        await asyncio.wait([asyncio.wrap_future(loading)])
        await up.wait()  # loaded before the prompt was up: it ends as soon as it is
        if not app.is_done:
            app.exit(result=session.default_buffer.text)

    ending = asyncio.create_task(end_when_loaded())
    try:
        return await session.prompt_async([("class:prompt", "› ")], handle_sigint=False,
                                          set_exception_handler=False, pre_run=up.set)
    except EOFError:
        return None
    finally:
        ending.cancel()
