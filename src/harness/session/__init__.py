"""The durable journal: sessions, entries and records, on memory, SQLite or PostgreSQL."""

from harness.session import addresses
from harness.session.addresses import ListAddress, ValueAddress, list_address, value_address
from harness.session.backend import CommitResult, SessionInfo
from harness.session.entries import (
    BranchPage,
    BranchSummaryPayload,
    CompactionPayload,
    CustomMessagePayload,
    CustomPayload,
    Entry,
    EntryPayload,
    EntryType,
    MessagePayload,
)
from harness.session.errors import (
    InvalidWrite,
    LaneExists,
    OwnershipLost,
    SessionNotFound,
    SessionOwned,
    StorageCorruption,
    StoreClosed,
    UnknownEntry,
    UnsupportedStoreUrl,
)
from harness.session.ids import new_id
from harness.session.migrations import DATA_MIGRATIONS, DataMigration
from harness.session.records import (
    LaneConfig,
    LaneLastResult,
    LaneState,
    OperationErrorRecord,
    OperationMeta,
    OperationState,
    PendingCustom,
    PendingEntry,
    PendingMessage,
    UsageRow,
)
from harness.session.session import (
    ListItem,
    Session,
    SessionMutator,
    SessionOwnership,
    SessionReader,
    StoredValue,
)
from harness.session.store import Store, connect

__all__ = [
    "DATA_MIGRATIONS",
    "BranchPage",
    "BranchSummaryPayload",
    "CommitResult",
    "CompactionPayload",
    "CustomMessagePayload",
    "CustomPayload",
    "DataMigration",
    "Entry",
    "EntryPayload",
    "EntryType",
    "InvalidWrite",
    "LaneConfig",
    "LaneExists",
    "LaneLastResult",
    "LaneState",
    "ListAddress",
    "ListItem",
    "MessagePayload",
    "OperationErrorRecord",
    "OperationMeta",
    "OperationState",
    "OwnershipLost",
    "PendingCustom",
    "PendingEntry",
    "PendingMessage",
    "Session",
    "SessionInfo",
    "SessionMutator",
    "SessionNotFound",
    "SessionOwned",
    "SessionOwnership",
    "SessionReader",
    "StorageCorruption",
    "Store",
    "StoreClosed",
    "StoredValue",
    "UnknownEntry",
    "UnsupportedStoreUrl",
    "UsageRow",
    "ValueAddress",
    "addresses",
    "connect",
    "list_address",
    "new_id",
    "value_address",
]
