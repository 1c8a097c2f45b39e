"""Text from outside the terminal client (model replies, thinking, tool output and arguments, names,
the person's own text echoed back), made safe to print: it can show anything but control nothing.

Every such text goes through `visible` before it reaches the screen, through `escape` when it
becomes part of a rich markup string and through `markdown` when it is a reply rendered as
Markdown, so only the client's own styling reaches the terminal.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING

from rich.markup import escape as escape_markup

if TYPE_CHECKING:
    from rich.markdown import Markdown

_BIDI_CONTROLS = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_CONTROLS = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI_CONTROLS}]")


def _shown(found: re.Match[str]) -> str:
    char = found.group()
    code = ord(char)
    if code < 0x20:
        return chr(0x2400 + code)  # the Unicode control pictures: ESC is shown as ␛
    if code == 0x7F:
        return "␡"
    return f"<U+{code:04X}>"  # C1 controls and bidirectional overrides have no picture


def visible(text: str) -> str:
    """`text` with every control character shown as a visible symbol instead of acting (ESC as ␛,
    a lone carriage return as ␍, C1 and bidirectional controls as `<U+XXXX>`); newlines and tabs
    are kept, and a CRLF line end becomes a newline."""
    return _CONTROLS.sub(_shown, text.replace("\r\n", "\n"))


def escape(text: str) -> str:
    """`visible(text)` escaped for rich markup, so `[bold]` in it stays literal: what
    `rich.markup.escape` does, for text that may also hold control characters."""
    return escape_markup(visible(text))


def markdown(text: str) -> Markdown:
    """`visible(text)` as rich Markdown (code blocks highlighted); HTML in it stays text and links
    show their address."""
    return _markdown_type()(visible(text))


@functools.cache
def _markdown_type() -> type[Markdown]:
    """rich's Markdown as the client renders it, made at the first reply rendered: its parser and
    highlighting are a tenth of a second of a start that may never render one (`harness sessions`,
    a new chat's prompt)."""
    from markdown_it import MarkdownIt
    from rich.markdown import Markdown

    # rich's own parser, without raw HTML: a reply about `<div>` shows it instead of dropping it.
    parser = MarkdownIt("commonmark", {"html": False}).enable("strikethrough").enable("table")

    class ClientMarkdown(Markdown):
        def __init__(self, text: str) -> None:
            super().__init__(text, justify="default", hyperlinks=False)  # "left" pads lines to the width
            self.parsed = parser.parse(text)
            # A line break the model wrote is kept (a hard break), as the chat keeps it by rendering line
            # by line: code whose opening fence is missing stays on its lines, not reflowed into one paragraph.
            for token in self.parsed:
                for inline in token.children or ():
                    if inline.type == "softbreak":
                        inline.type = "hardbreak"

    return ClientMarkdown
