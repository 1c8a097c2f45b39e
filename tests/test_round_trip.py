"""Which record types the journal writes without reading them back.

White-box: it asks `harness.session.round_trip` for its verdicts directly, on the journal's own
entry adapter among others; the behaviour they allow (a write that skips its read-back) is
tested through the journal in test_hostile_input.py."""

from __future__ import annotations

import math
from typing import Annotated, Any

import pytest
from pydantic import AfterValidator, BaseModel, Field, JsonValue, TypeAdapter

from harness.messages import CleanJson, Record
from harness.session import MessagePayload
from harness.session.entries import ENTRY_PAYLOAD_ADAPTER
from harness.session.records import OperationState
from harness.session.round_trip import always_reads_back


class _Plain(BaseModel):
    text: str


class _BadDefault(Record):
    count: int = "none"  # type: ignore[assignment]  # the mistake this test is about


class _ConstructsUnchecked(Record):
    text: str

    @classmethod
    def model_construct(cls, _fields_set: set[str] | None = None, **values: Any) -> _ConstructsUnchecked:  # type: ignore[override]
        return BaseModel.model_construct.__func__(cls, _fields_set, **values)  # type: ignore[attr-defined,no-any-return]


class _Validated(Record):
    text: Annotated[str, AfterValidator(str.upper)]


class _Aliased(Record):
    text: str = Field(serialization_alias="words")


class _Tree(Record):
    children: list[_Tree] = Field(default_factory=list)


class _Untyped(Record):
    anything: Any


class _RawJson(Record):
    data: JsonValue


class _Floats(Record):
    ratio: float
    details: CleanJson = None


@pytest.mark.parametrize("adapter", [ENTRY_PAYLOAD_ADAPTER, TypeAdapter(OperationState), TypeAdapter(_Floats),
                                     TypeAdapter(CleanJson), TypeAdapter(str | None), TypeAdapter(list[int])],
                         ids=["entry payload", "operation state", "finite floats", "clean JSON", "text", "ints"])
def test_records_and_plain_values_are_written_without_a_read_back(adapter: TypeAdapter[Any]) -> None:
    assert always_reads_back(adapter)


@pytest.mark.parametrize("adapter", [
    TypeAdapter(_Plain), TypeAdapter(_BadDefault), TypeAdapter(_ConstructsUnchecked), TypeAdapter(_Validated),
    TypeAdapter(_Aliased), TypeAdapter(float), TypeAdapter(JsonValue), TypeAdapter(list[_Plain]),
    TypeAdapter(_Tree), TypeAdapter(_Untyped), TypeAdapter(_RawJson),
], ids=["a plain model", "an invalid default", "unchecked construction", "a validator of its own", "an alias",
        "a float that may be NaN", "JSON that may hold NaN", "a list of plain models",
        "a recursive record (nesting past the reader's limit)", "any Python value", "JSON of any depth"])
def test_anything_that_might_not_read_back_is_read_back(adapter: TypeAdapter[Any]) -> None:
    """Each of these can turn a validated (or unvalidated) value into JSON its reader refuses or
    reads differently, so the journal keeps reading it back."""
    assert not always_reads_back(adapter)


def test_what_the_verdict_relies_on_holds() -> None:
    """A `Record`'s floats are finite and its JSON values clean: NaN never reaches the serializer,
    which would write it as null."""
    with pytest.raises(ValueError, match="finite"):
        _Floats(ratio=math.nan)
    with pytest.raises(ValueError, match="finite"):
        _Floats(ratio=1.0, details={"x": math.inf})
    payload = MessagePayload.model_validate({"message": {"role": "user", "content": "hi", "timestamp": 1}})
    assert ENTRY_PAYLOAD_ADAPTER.validate_json(ENTRY_PAYLOAD_ADAPTER.dump_json(payload)) == payload
