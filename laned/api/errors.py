"""The API's one error envelope, `{"error": {"code", "message", "hint", ...}}`, and the one
table from laned's errors to HTTP statuses: every LanedError keeps its message and hint."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from laned import errors
from laned.core.facts import findings_json

# Most specific first: the first class an error is an instance of decides its status.
STATUS: tuple[tuple[type[errors.LanedError], int], ...] = (
    (errors.UnknownLane, 404),
    (errors.PreflightFailed, 409),  # nothing was stopped or started
    (errors.Superseded, 409),
    (errors.LaneNotRunning, 409),
    (errors.RankNotAsleep, 409),  # the worker's rank serves on; its head stops the lane
    (errors.ConfigRefused, 409),  # the running config stays in force
    (errors.NotAContainer, 400),
    (errors.ConfigError, 400),
    (errors.BadRequest, 400),
    (errors.SecretsFileError, 400),
    (errors.UsageError, 400),
    (errors.WaitTimedOut, 504),  # the request goes on
    (errors.UnsafeApi, 409),
    (errors.SecretFileRefused, 409),
    (errors.EngineParserFailed, 503),
    (errors.ActivationFailed, 502),  # the engine failed: upstream of laned
    (errors.EngineUnreachable, 502),
    (errors.EngineRefused, 502),
    (errors.PeerUnreachable, 503),  # another host's laned: nothing was started here
    (errors.PodmanError, 503),  # the podman API service does not answer or refuses
    (errors.JournalUnavailable, 503),  # journalctl is missing, or journald cannot be read
    (errors.BodyParserLost, 503),  # the worker reading a large body died: try again
    (errors.SystemdError, 503),  # the user manager does not answer or refuses
    (errors.LaneError, 502),
    (errors.LanedError, 500),
)


def status_of(exc: errors.LanedError) -> int:
    """The HTTP status of one of laned's errors."""
    return next(status for cls, status in STATUS if isinstance(exc, cls))


def envelope(
    status: int, code: str, message: str, hint: str = "", extra: dict[str, Any] | None = None
) -> JSONResponse:
    """The one error shape (`extra` adds detail, such as preflight's findings)."""
    error = {"code": code, "message": message, "hint": hint, **(extra or {})}
    return JSONResponse({"error": error}, status_code=status)


def laned_error(exc: errors.LanedError) -> JSONResponse:
    """A LanedError as the envelope, with its status from the table."""
    extra = None
    message, hint = exc.message, exc.hint
    if isinstance(exc, errors.PreflightFailed):
        extra = {"findings": findings_json(exc.findings)}
    if isinstance(exc, errors.ConfigError):
        # Every problem with its key path, and what the reload did not do.
        message = str(exc)
        hint = "fix the file and POST /reload again; the running config stays in force"
    return envelope(status_of(exc), exc.code, message, hint, extra)


def install(app: FastAPI) -> None:
    """Answer every error with the envelope."""

    @app.exception_handler(errors.LanedError)
    async def _laned(_: Request, exc: errors.LanedError) -> JSONResponse:
        return laned_error(exc)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("query", "path"))
        return envelope(
            400,
            "bad-request",
            f"{where}: {first.get('msg', 'invalid')}",
            "see /docs for the parameters",
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not-found", 405: "method-not-allowed"}.get(exc.status_code, "http-error")
        return envelope(exc.status_code, code, str(exc.detail), "see /docs for the endpoints")

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        return unexpected(exc)


def unexpected(exc: Exception) -> JSONResponse:
    """The answer to an error laned did not expect (the exception itself goes to the log)."""
    return envelope(
        500,
        "internal",
        f"laned failed: {type(exc).__name__}",
        "see laned's log (journalctl --user -u laned)",
    )
