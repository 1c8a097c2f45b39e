"""A conversation's name from its first prompt, as every door offers it (the terminal's chat, the
page's chat door)."""

from __future__ import annotations

SESSION_NAME_LIMIT = 80
"""At most this many characters of a prompt name a conversation."""


def session_name_from(prompt: str) -> str | None:
    """A session name from a prompt: its first non-blank line, whitespace collapsed, clipped to
    `SESSION_NAME_LIMIT` characters (the last an ellipsis); None for a prompt with no text."""
    for line in prompt.splitlines():
        if line.strip():
            line = " ".join(line.split())
            return line if len(line) <= SESSION_NAME_LIMIT else line[: SESSION_NAME_LIMIT - 1] + "…"
    return None
