"""A field added to a stored record (issue 32: a run's `traceparent`, its output schema and
retries) is left out of the record's JSON while at its default, so an older reader, whose records
refuse a field they do not know, reads what this version writes for a run that uses none of
them; a run that does use one needs this version (the version step `harness.session.records`
and docs/workers.md describe).

The older reader is its record types as they were before those fields (8045a33's parent), read
through the journal's own value read (`Store.values_across`) under its rules."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest
from pydantic import Field, TypeAdapter

from harness.context import Context
from harness.messages import CleanStr, ModelIdentity, OutputSchema, Record
from harness.providers import FAUX_MODEL, FauxProvider, ModelRegistry
from harness.runtime import AgentHarness, AgentHarnessOptions, PromptRequest
from harness.session import LaneConfig, StorageCorruption, ValueAddress, addresses, connect
from harness.session.records import OperationMeta, RunIntent

FAUX = ModelIdentity(provider=FAUX_MODEL.provider, model_id=FAUX_MODEL.id)


class OlderRunIntent(Record):
    kind: Literal["run"] = "run"
    prompt_entry_ids: list[str]


class OlderCompactionIntent(Record):
    kind: Literal["compaction"] = "compaction"
    custom_instructions: CleanStr | None = None


class OlderNavigationIntent(Record):
    kind: Literal["navigation"] = "navigation"
    target_id: str | None
    summarize: bool = False
    label: CleanStr | None = None
    custom_instructions: CleanStr | None = None


class OlderOperationMeta(Record):
    operation_id: str
    lane: str
    source_tip_id: str | None
    started_at: int
    intent: Annotated[OlderRunIntent | OlderCompactionIntent | OlderNavigationIntent, Field(discriminator="kind")]


async def accepted_meta(request: PromptRequest, ctx: Context) -> tuple[OperationMeta, OlderOperationMeta]:
    """Accept `request` on a fresh journal; its operation's record as this version and as the
    older reader read it (the latter raising what that reader raises)."""
    store = await connect("memory://", ctx)
    try:
        session = await store.create_session(ctx)
        await session.create_lane("main", LaneConfig(model=FAUX), ctx)
        registry = ModelRegistry([FAUX_MODEL], providers={"faux": FauxProvider([])})
        harness, _ = await AgentHarness.create(AgentHarnessOptions(session=session, models=registry), ctx)
        accepted = await harness.lane("main").accept(request, ctx)
        address = addresses.operation_meta(accepted.operation_id)
        ours = await session.get(address, ctx)
        await harness.close(ctx)
        assert ours is not None
        older = ValueAddress(address.namespace, address.key, TypeAdapter(OlderOperationMeta))
        return ours, (await store.values_across(older, ctx))[session.id]
    finally:
        await store.close()


async def test_a_run_that_uses_no_added_field_is_read_by_an_older_reader(ctx: Context) -> None:
    ours, older = await accepted_meta(PromptRequest(text="hi"), ctx)

    assert ours.traceparent is None
    assert isinstance(ours.intent, RunIntent)
    assert (ours.intent.output, ours.intent.output_retries) == (None, 0)
    assert older.operation_id == ours.operation_id
    assert older.intent == OlderRunIntent(prompt_entry_ids=ours.intent.prompt_entry_ids)


async def test_a_run_that_uses_an_added_field_needs_the_version_that_knows_it(ctx: Context) -> None:
    """The version step: a run with an output schema is refused by the older reader as
    undecodable, and read whole by this one."""
    schema = OutputSchema.of({"type": "object", "properties": {"name": {"type": "string"}}})

    with pytest.raises(StorageCorruption, match="output"):
        await accepted_meta(PromptRequest(text="hi", output=schema, output_retries=1), ctx)


def test_added_fields_are_written_only_when_set() -> None:
    """This version reads back what it writes with the added fields set, and leaves them out
    while at their defaults."""
    adapter = TypeAdapter(OperationMeta)
    bare = OperationMeta(operation_id="op", lane="main", source_tip_id=None, started_at=1,
                         intent=RunIntent(prompt_entry_ids=["e"]))
    traced = bare.model_copy(update={
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "intent": RunIntent(prompt_entry_ids=["e"], output=OutputSchema.of({"type": "object"}), output_retries=2)})

    assert adapter.dump_python(bare, mode="json") == {
        "operation_id": "op", "lane": "main", "source_tip_id": None, "started_at": 1,
        "intent": {"kind": "run", "prompt_entry_ids": ["e"]}}
    assert adapter.validate_json(adapter.dump_json(traced)) == traced
