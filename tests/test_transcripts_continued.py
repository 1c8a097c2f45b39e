"""Real transcripts, imported and continued with one more turn through the harness, give a
request every wire format accepts (issue 6, "Real input, end to end")."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import SHARED_FIXTURES, needs_shared_fixtures
from drive_helpers import FAUX, start_rig, within
from harness.context import Context
from harness.imports import import_claude_code_session, import_pi_session
from harness.providers import ProviderRequest, StreamOptions
from harness.runtime import Settled
from harness.session import Store
from request_validators import problems
from test_provider_requests import BUILDERS, TEXT_ONLY, VISION

TRANSCRIPTS = sorted((SHARED_FIXTURES / "transcripts").glob("*.jsonl"))


@needs_shared_fixtures
@pytest.mark.parametrize("path", TRANSCRIPTS, ids=[path.stem for path in TRANSCRIPTS])
async def test_an_imported_transcript_continues_with_a_valid_request_in_every_format(
    store: Store, ctx: Context, path: Path
) -> None:
    importer = import_pi_session if path.name.startswith("pi-") else import_claude_code_session
    report = await importer(store, path, "user", ctx)
    session = await store.open_session(report.session_id, ctx)
    rig = await start_rig(store, ctx, ["Continuing from here."], session=session)
    await rig.lane.set_model(FAUX, ctx)

    outcome = await within(rig.lane.prompt("Please go on.", None, ctx))

    assert isinstance(outcome, Settled)
    assert outcome.result.outcome == "completed"
    sent = rig.faux.requests[0].request
    assert sent.messages[-1].content == "Please go on."
    for api, build in BUILDERS.items():
        for model in (VISION[api], TEXT_ONLY[api]):
            params = build(model, ProviderRequest(system_prompt=sent.system_prompt, messages=sent.messages,
                                                  tools=sent.tools), StreamOptions())
            assert problems(api, params, model) == [], (api, model.id)
