"""How errors reach an HTTP client: every `HarnessError` as JSON `{code, message, details}` with a
status that fits it, and someone else's conversation answered exactly like a missing one."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import JsonValue
from starlette.exceptions import HTTPException

from harness.conversation import Forbidden
from harness.errors import HarnessError
from harness.session import SessionNotFound

logger = logging.getLogger(__name__)


class Unauthorized(HarnessError):
    """The request carries no bearer token, or one the store does not know (or revoked); nothing
    was read or changed."""

    code = "unauthorized"


class ConversationHeld(HarnessError):
    """`harness serve --workers external`: another process holds the conversation, a worker
    driving its run as a rule; nothing was written. Steer, follow up or stop the run (those
    reach the worker), or send the turn once the run has ended. Details `{conversation_id}`."""

    code = "conversation_held"


class ExternalModeUnsupported(HarnessError):
    """`harness serve --workers external`: this route would drive work in the API process (a
    compaction's summary, `/compact`), which that mode never does, and no worker takes it over.
    Details `{route}`."""

    code = "external_mode_unsupported"


STORE_FAULTS = ("store_unavailable", "store_connection_lost", "store_closed", "harness_closed", "store_full")
"""The codes of a store that cannot serve now: a 503 whose body says so in words of the server's.
A full disk is one: once space is freed the next sweep finishes what it stopped (issue 29)."""

STATUS_BY_CODE: dict[str, int] = {
    **dict.fromkeys(["unauthorized"], 401),
    **dict.fromkeys(["host_not_allowed", "origin_not_allowed"], 403),
    **dict.fromkeys(["session_not_found", "image_not_found", "unknown_entry", "unknown_lane", "garden_not_found",
                     "goal_not_found", "job_not_found", "approval_not_found", "assistant_not_found",
                     "run_not_found"], 404),
    **dict.fromkeys(["lane_busy", "model_switch_refused", "session_owned", "no_active_operation", "not_a_run",
                     "conversation_ended", "project_switch_refused", "operation_mismatch", "nothing_to_resume",
                     "operation_id_taken", "lane_exists", "garden_exists", "id_taken", "thread_exists",
                     "conversation_held", "garden_damaged", "goal_damaged", "conversation_in_use",
                     "approval_answered"], 409),
    **dict.fromkeys(["prompt_too_large", "record_too_large", "request_too_large"], 413),
    **dict.fromkeys([*STORE_FAULTS, "server_busy"], 503),
    **dict.fromkeys(["storage_corruption", "harness_fault", "garden_write_failed", "ownership_lost",
                     "storage_rolled_back",
                     "setting_not_recorded", "listener_reentry", "reentrant_mutation"], 500),
    **dict.fromkeys(["external_mode_unsupported"], 501),
}
"""The HTTP status of each error code a route can raise; any other `HarnessError` is the caller's
request that cannot be done as asked (400)."""


UNAVAILABLE = ("the server's store cannot serve requests right now (its log says why); try again shortly, and "
               "read before repeating a change: one in flight may or may not have been made")
"""The message of every 503, whatever the store said: its text, which names the database's host,
port and role or its file, stays in the server's log (issue 29)."""


def status_of(error: HarnessError) -> int:
    return STATUS_BY_CODE.get(error.code, 400)


def error_body(code: str, message: str, details: dict[str, JsonValue] | None = None) -> dict[str, JsonValue]:
    """The JSON body of every error answer: `{code, message, details}`."""
    return {"code": code, "message": message, "details": details or {}}


def not_found(conversation_id: str) -> JSONResponse:
    """The one answer for a conversation that does not exist and for one of another user: the
    two must read the same, so nobody learns which ids exist."""
    return JSONResponse(error_body(SessionNotFound.code, f"no conversation {conversation_id!r}",
                                   {"conversation_id": conversation_id}), status_code=404)


def install_error_handlers(app: FastAPI) -> None:
    """Answer `HarnessError`, request validation and routing errors as `{code, message, details}`."""

    async def harness_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, HarnessError)
        conversation_id = request.path_params.get("conversation_id")
        if isinstance(error, Forbidden | SessionNotFound) and isinstance(conversation_id, str):
            return not_found(conversation_id)
        status = status_of(error)
        if status >= 500:
            logger.error("%s %s failed: [%s] %s %s", request.method, request.url.path, error.code, error.message,
                         error.details)
        if error.code in STORE_FAULTS:  # the store's own words stay in the log
            return JSONResponse(error_body(error.code, UNAVAILABLE), status_code=status)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        return JSONResponse(error.to_json(), status_code=status, headers=headers)

    async def invalid_request(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RequestValidationError)
        problems: list[JsonValue] = [
            {"loc": [str(part) for part in problem.get("loc", ())], "msg": str(problem.get("msg", ""))}
            for problem in error.errors()]
        first = problems[0] if problems else {"msg": "invalid request"}
        message = first["msg"] if isinstance(first, dict) else "invalid request"
        return JSONResponse(error_body("invalid_input", f"invalid request: {message}", {"problems": problems}),
                            status_code=400)

    async def http_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(error.status_code,
                                                                                          "http_error")
        return JSONResponse(error_body(code, str(error.detail)), status_code=error.status_code,
                            headers=error.headers)

    app.add_exception_handler(HarnessError, harness_error)
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(HTTPException, http_error)
