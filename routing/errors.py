"""What the routing path tells clients when a backend fails: a stable code and a generic
message, never a backend's name, URL, credential reference or a provider's own words (a
provider's message can name its upstream model, account or host). The detail goes to the log
with the request id, and to the backend's `last_error` in the admin.

A backend's failure becomes its ApplicationError here, once, where the adapter meets it
(`backend_error`): the client's message and code, the backend's name and its own words
(`detail`) beside them. Whether the client must hear it (its own mistake, a content filter)
is the error class's `surfaced`; every other failure may fall through to the next backend."""

from __future__ import annotations

from tenants.errors import ApplicationError, InvalidRequest, error_from_code
from workers.engine import EngineError

# Per code: what a client is told, whoever failed.
CLIENT_MESSAGES = {
    "backend_unavailable": "The model's backend is unavailable right now; retry later.",
    "timeout": "The model's backend did not answer in time; retry later.",
    "rate_limited": "The model's backend is rate limited right now; retry after the time in "
    "Retry-After.",
    "invalid_request": "The model's backend refused this request as invalid; check its parameters.",
    "context_length_exceeded": "The prompt and max_tokens do not fit this model's context.",
    "content_filtered": "The request was refused by a content filter.",
    # One of our own stores failed (the queue's Redis): not the backend's fault.
    "service_unavailable": "The service is briefly unavailable; retry shortly.",
}
# The codes a client hears as they are; any other failure (a provider's rate limit
# included: it is the platform's account, not the client's) is backend_unavailable, whose
# 503 says retry, while the backend's own code stays on the error for the fall-through.
CLIENT_CODES = {
    "invalid_request",
    "context_length_exceeded",
    "content_filtered",
    "timeout",
    "service_unavailable",
}
MID_STREAM = (
    "The answer was interrupted by its backend after it started; what was streamed is billed."
)


def backend_error(
    code: str, detail: str, *, backend: str, status: int = 0, retry_after: float | None = None
) -> ApplicationError:
    """A backend's failure as the error its client would see: the platform's code for what
    the backend reported (surfaced codes, timeouts and rate limits keep theirs; anything else
    is backend_unavailable), the client's message, and the backend's own words in `detail`
    (with its HTTP status, when it answered one)."""
    client_code = code if code in CLIENT_CODES else "backend_unavailable"
    error = error_from_code(
        client_code,
        CLIENT_MESSAGES[client_code],
        retry_after=retry_after,
        backend=backend,
        backend_code=code,
        detail=f"{status} {detail}" if status else detail,
    )
    return error.replace(retryable=not error.surfaced)


def backend_error_mid_stream(error: ApplicationError) -> ApplicationError:
    """What a client hears when its answer's backend failed after the first token: a
    surfaced error as it is, a timeout as a timeout, anything else as interrupted."""
    if error.surfaced:
        return error
    if error.code == "timeout":
        return error_from_code("timeout", CLIENT_MESSAGES["timeout"])
    return error_from_code("backend_unavailable", MID_STREAM)


def engine_refusal(exc: EngineError) -> ApplicationError:
    """The engine's refusal of a request's input (it raises its own plain exceptions, with
    a code and the parameter at fault), as the client's error."""
    return error_from_code(exc.code, exc.message, param=exc.param)


class FileTooLarge(InvalidRequest):
    """An upload over FAIRLANE_FILE_MAX_BYTES (the message names the limit)."""

    code, status = "file_too_large", 413


class StorageQuotaExceeded(InvalidRequest):
    """An upload that would take the tenant's files past FAIRLANE_FILES_TENANT_QUOTA_BYTES."""

    code, status = "storage_quota_exceeded", 413
