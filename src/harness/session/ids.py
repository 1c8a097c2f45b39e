"""Identifiers: time-ordered UUIDv7 strings for entries, operations, usage rows and sessions."""

from __future__ import annotations

import os
import time


def new_id(timestamp_ms: int | None = None) -> str:
    """A UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then 74 random bits, so ids sort by time."""
    ms = time.time_ns() // 1_000_000 if timestamp_ms is None else timestamp_ms
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & 0xFFFF_FFFF_FFFF) << 80 | 0x7 << 76 | (rand >> 68 & 0xFFF) << 64 | 0b10 << 62
    value |= rand & 0x3FFF_FFFF_FFFF_FFFF
    digits = f"{value:032x}"  # what str(uuid.UUID(int=value)) gives, without building the UUID
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"
