"""The image store beside the journal: images kept once by the SHA-256 of their bytes.

An image is stored under its `ref`, the lowercase hex SHA-256 of its bytes, so storing the same
picture twice keeps one copy, and a journal entry holds the 64-character ref instead of the bytes.
Only PNG, JPEG, GIF and WebP are kept, recognised from their first bytes (never from a claimed
type); the media type is read from the bytes again on every read. Storing an image that is
already there refreshes its `stored_at`, which is what a sweep's grace period counts from.

Where the images live: a SQLite journal keeps them in a folder beside the database file
(`harness.db.images/`, one file per ref, like `harness.db.commit-mark`): an image is immutable, so
it needs no transaction, and the database stays small enough to copy and to keep in the page
cache. A PostgreSQL store keeps them in its `images` table, since the processes of a hosted
deployment share the database and nothing else. The memory store keeps them in a dict.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from harness.context import Context
from harness.errors import HarnessError
from harness.messages import now_ms

MAX_IMAGE_BYTES = 5 * 1024 * 1024
"""The largest image the store keeps (5 MiB), the limit the hosted model APIs put on one image."""

_REF = re.compile(r"[0-9a-f]{64}")


class UnsupportedImage(HarnessError):
    """The bytes are not a PNG, JPEG, GIF or WebP image, or are larger than `MAX_IMAGE_BYTES`;
    nothing was stored. Details: `bytes`."""

    code = "unsupported_image"


@dataclass(frozen=True)
class StoredImage:
    """An image read back: its `ref`, the media type its bytes say, and the bytes."""

    ref: str
    mime_type: str
    data: bytes


def sniff_image_type(data: bytes) -> str | None:
    """The media type that `data`'s leading magic bytes name (`image/png`, `image/jpeg`,
    `image/gif`, `image/webp`), or None for anything else."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if len(data) >= 12 and data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def image_ref(data: bytes) -> str:
    """The ref an image is stored under: the lowercase hex SHA-256 of its bytes."""
    return hashlib.sha256(data).hexdigest()


def is_image_ref(ref: str) -> bool:
    """Whether `ref` has the shape of a ref (64 lowercase hex digits); says nothing of existence."""
    return _REF.fullmatch(ref) is not None


def check_image(data: bytes) -> str:
    """`data`'s ref, after checking it is an image the store keeps (`UnsupportedImage` if not)."""
    if len(data) > MAX_IMAGE_BYTES:
        raise UnsupportedImage(f"an image may take at most {MAX_IMAGE_BYTES:,} bytes, not {len(data):,}",
                               bytes=len(data))
    if sniff_image_type(data) is None:
        raise UnsupportedImage("the bytes are not a PNG, JPEG, GIF or WebP image", bytes=len(data))
    return image_ref(data)


def stored_image(ref: str, data: bytes) -> StoredImage:
    mime_type = sniff_image_type(data)
    assert mime_type is not None, "only sniffed images are stored"
    return StoredImage(ref=ref, mime_type=mime_type, data=data)


class ImageStore(Protocol):
    """Images by content, shared by every session of one store."""

    async def put(self, data: bytes, context: Context) -> str:
        """Store `data` (once: a second put of the same bytes only refreshes its `stored_at`) and
        return its ref. Raises `UnsupportedImage` for bytes that are not a kept image type or are
        over `MAX_IMAGE_BYTES`."""
        ...

    async def get(self, ref: str, context: Context) -> StoredImage | None:
        """The image stored under `ref`, or None (also for a string that is not a ref)."""
        ...

    async def stored(self, context: Context) -> dict[str, int]:
        """Every stored ref and its `stored_at` (Unix ms of its latest put)."""
        ...

    async def delete(self, ref: str, stored_by: int, context: Context) -> bool:
        """Delete the image under `ref` if its latest put was at or before `stored_by` (Unix ms),
        so an image stored again since is kept; True if it was deleted."""
        ...


class MemoryImages:
    """Images in a dict: the memory store's."""

    def __init__(self) -> None:
        self._images: dict[str, tuple[bytes, int]] = {}

    async def put(self, data: bytes, context: Context) -> str:
        ref = check_image(data)
        self._images[ref] = (bytes(data), now_ms())
        return ref

    async def get(self, ref: str, context: Context) -> StoredImage | None:
        found = self._images.get(ref)
        return stored_image(ref, found[0]) if found is not None else None

    async def stored(self, context: Context) -> dict[str, int]:
        return {ref: stored_at for ref, (_, stored_at) in self._images.items()}

    async def delete(self, ref: str, stored_by: int, context: Context) -> bool:
        found = self._images.get(ref)
        if found is None or found[1] > stored_by:
            return False
        del self._images[ref]
        return True


class FolderImages:
    """Images as files named by their ref in one folder (the SQLite store's, beside its database).

    A put writes a temporary file, syncs it and renames it into place, then syncs the folder, so
    the image is durable before any journal commit that names it and a crash never leaves half an
    image under a ref. `stored_at` is the file's modification time. File work runs off the event
    loop."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    async def put(self, data: bytes, context: Context) -> str:
        ref = check_image(data)
        await asyncio.to_thread(self._write, ref, bytes(data))
        return ref

    def _write(self, ref: str, data: bytes) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / ref
        try:
            os.utime(path)  # stored already: the sweep's grace period starts over
            return
        except FileNotFoundError:
            pass
        temporary = self.folder / f".{ref}.{secrets.token_hex(4)}.tmp"
        with open(temporary, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
        directory = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    async def get(self, ref: str, context: Context) -> StoredImage | None:
        if not is_image_ref(ref):  # a ref names a file: nothing else may reach the file system
            return None
        try:
            data = await asyncio.to_thread((self.folder / ref).read_bytes)
        except FileNotFoundError:
            return None
        return stored_image(ref, data)

    async def stored(self, context: Context) -> dict[str, int]:
        return await asyncio.to_thread(self._list)

    def _list(self) -> dict[str, int]:
        if not self.folder.is_dir():
            return {}
        found = {}
        for path in self.folder.iterdir():
            if is_image_ref(path.name):
                try:
                    found[path.name] = path.stat().st_mtime_ns // 1_000_000
                except FileNotFoundError:
                    continue  # deleted meanwhile
        return found

    async def delete(self, ref: str, stored_by: int, context: Context) -> bool:
        if not is_image_ref(ref):
            return False
        return await asyncio.to_thread(self._delete, self.folder / ref, stored_by)

    @staticmethod
    def _delete(path: Path, stored_by: int) -> bool:
        # A put between the check and the unlink loses its image: the grace period a sweep
        # passes (an hour by default) is what makes that window unreachable in practice.
        try:
            if path.stat().st_mtime_ns // 1_000_000 > stored_by:
                return False
            path.unlink()
        except FileNotFoundError:
            return False
        return True
