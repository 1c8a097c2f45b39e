"""The bearer tokens of `harness serve`, stored hashed beside the sessions.

A token reads `harness_<id>_<secret>`: `id` names its row, and `secret` is 32 random bytes
(URL-safe base64). The store keeps only the SHA-256 of the secret, so a copy of the database lets
nobody in; a request's secret is hashed and compared in constant time with the row its id names.
A token is shown once, when it is created; a revoked one stays listed (with `revoked_at`) and lets
nobody in again.

Where they live: a table of the store (`tokens`, on SQLite and PostgreSQL; a dict in memory),
not a session's records, because a token belongs to no conversation and every server process on
the database must see a revocation at its next request."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import unicodedata
from dataclasses import dataclass, replace
from typing import Protocol

from harness.context import Context
from harness.errors import HarnessError, InvalidInput
from harness.messages import now_ms
from harness.session.ids import new_id

TOKEN_PREFIX = "harness_"
_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
USER_CHARS = 200
"""The longest user id a token may name."""


class TokenNotFound(HarnessError):
    """No token has this id; nothing changed. Details `{token_id}`."""

    code = "token_not_found"


@dataclass(frozen=True)
class TokenInfo:
    """A token as listed: never its secret. Times are Unix ms; `revoked_at` None while valid."""

    id: str
    user: str
    created_at: int
    revoked_at: int | None = None


@dataclass(frozen=True)
class TokenRow:
    """A stored token: its info and the hex SHA-256 of its secret."""

    info: TokenInfo
    digest: str


@dataclass(frozen=True)
class TokenSql:
    """The statements of the SQL backends' `tokens` table, written once for both; a row read
    back by `get` is `token_row`, one by `list` or `revoke` is `TokenInfo(*row)`."""

    insert: str
    get: str
    list: str
    revoke: str


def token_sql(p: str) -> TokenSql:
    """The token statements with the driver's placeholder `p` (`?` for SQLite, `%s` for psycopg)."""
    columns = "id, user_id, created_at, revoked_at"  # `TokenInfo`'s fields, in order
    return TokenSql(
        insert=f"INSERT INTO tokens (id, user_id, digest, created_at) VALUES ({p}, {p}, {p}, {p})",
        get=f"SELECT {columns}, digest FROM tokens WHERE id = {p}",
        list=f"SELECT {columns} FROM tokens ORDER BY created_at, id",
        revoke=f"UPDATE tokens SET revoked_at = coalesce(revoked_at, {p}) WHERE id = {p} RETURNING {columns}",
    )


def token_row(found: tuple[str, str, int, int | None, str] | None) -> TokenRow | None:
    """The row `TokenSql.get` read, or None when it found none."""
    return TokenRow(TokenInfo(*found[:4]), found[4]) if found is not None else None


class TokenTable(Protocol):
    """Each backend's token rows."""

    async def insert(self, row: TokenRow, context: Context) -> None: ...

    async def get(self, token_id: str, context: Context) -> TokenRow | None: ...

    async def list(self, context: Context) -> list[TokenInfo]:
        """Every token, oldest first."""
        ...

    async def revoke(self, token_id: str, revoked_at: int, context: Context) -> TokenInfo | None:
        """Set `revoked_at` unless already set; the row as it is now, or None for no such id."""
        ...


class MemoryTokens:
    """Token rows in a dict: the memory store's."""

    def __init__(self) -> None:
        self._rows: dict[str, TokenRow] = {}

    async def insert(self, row: TokenRow, context: Context) -> None:
        self._rows[row.info.id] = row

    async def get(self, token_id: str, context: Context) -> TokenRow | None:
        return self._rows.get(token_id)

    async def list(self, context: Context) -> list[TokenInfo]:
        return sorted((row.info for row in self._rows.values()), key=lambda info: (info.created_at, info.id))

    async def revoke(self, token_id: str, revoked_at: int, context: Context) -> TokenInfo | None:
        row = self._rows.get(token_id)
        if row is None:
            return None
        if row.info.revoked_at is None:
            row = self._rows[token_id] = replace(row, info=replace(row.info, revoked_at=revoked_at))
        return row.info


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class Tokens:
    """The store's bearer tokens (`Store.tokens`)."""

    def __init__(self, table: TokenTable) -> None:
        self._table = table

    async def create(self, user: str, context: Context) -> tuple[str, TokenInfo]:
        """A new token for `user`: its text (shown once, never stored) and its info. Raises
        `InvalidInput` for a user id that is empty, longer than `USER_CHARS` or holds control
        characters; nothing is stored then."""
        if not user or len(user) > USER_CHARS or any(unicodedata.category(c)[0] in "CZ" and c != " " for c in user):
            raise InvalidInput(f"a user id is 1 to {USER_CHARS} printable characters, not {user[:80]!r}",
                               user=user[:80])
        secret = secrets.token_urlsafe(32)
        info = TokenInfo(id=new_id(), user=user, created_at=now_ms())
        await self._table.insert(TokenRow(info, _digest(secret)), context)
        return f"{TOKEN_PREFIX}{info.id}_{secret}", info

    async def user_of(self, token: str, context: Context) -> str | None:
        """The user `token` belongs to, or None when it is malformed, unknown or revoked."""
        token_id, separator, secret = token.removeprefix(TOKEN_PREFIX).partition("_")
        if not token.startswith(TOKEN_PREFIX) or not separator or not secret or not _ID.fullmatch(token_id):
            return None
        row = await self._table.get(token_id, context)
        if row is None or row.info.revoked_at is not None:
            return None
        return row.info.user if hmac.compare_digest(_digest(secret), row.digest) else None

    async def list(self, context: Context) -> list[TokenInfo]:
        """Every token, revoked ones included, oldest first; never a secret."""
        return await self._table.list(context)

    async def revoke(self, token_id: str, context: Context) -> TokenInfo:
        """Revoke the token `token_id` (again: nothing changes) and return its info; from the next
        request on it lets nobody in. Raises `TokenNotFound`."""
        info = await self._table.revoke(token_id, now_ms(), context)
        if info is None:
            raise TokenNotFound(f"no token {token_id!r}", token_id=token_id[:80])
        return info
