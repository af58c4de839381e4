"""Application errors: one class per failure, each with a stable code, mapped once to HTTP and
the OpenAI error body `{"error": {"message", "type", "code", "param"}}`.

Every app raises these (or its own subclasses). One function renders them for HTTP
(`tenants.apis.errors.error_response`: the DRF exception handler, the /v1 API, the 404/500
pages) and one for websocket frames (`routing.consumers.error_frame`), both from the body
`error_body_for` builds.
"""

from __future__ import annotations


class ApplicationError(Exception):
    code = "internal_error"
    status = 500
    type = "server_error"
    default_message = "The server had an error while processing your request."
    # Sent as x-should-retry so OpenAI's clients do not retry what cannot succeed.
    should_retry: bool | None = None
    # Whether the router may try this request again, here or on another backend (set where
    # an error is raised on the routing path).
    retryable: bool = False

    def __init__(self, message: str | None = None, *, param: str | None = None,
                 retry_after: int | None = None) -> None:
        self.message = message or self.default_message
        self.param = param
        self.retry_after = retry_after
        self.headers: dict[str, str] = {}  # extra response headers (e.g. the brownout's)
        super().__init__(self.message)


class InvalidRequest(ApplicationError):
    code, status, type = "invalid_request", 400, "invalid_request_error"
    default_message = "The request is not valid."


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"
    default_message = "The prompt is longer than the model's context."


class ContentFiltered(InvalidRequest):
    code = "content_filtered"
    default_message = "The request was refused by a content filter."


class AuthenticationFailed(ApplicationError):
    code, status, type = "authentication", 401, "authentication_error"
    default_message = "Incorrect, expired or revoked API key, or no credentials provided."


class PermissionDenied(ApplicationError):
    code, status, type = "permission", 403, "permission_error"
    default_message = "You are not allowed to do this."


class NotFound(ApplicationError):
    code, status, type = "not_found", 404, "not_found_error"
    default_message = "Not found."


class RateLimited(ApplicationError):
    code, status, type = "rate_limited", 429, "rate_limit_error"
    default_message = "Rate limit exceeded; retry after the time in Retry-After."


class BudgetExhausted(ApplicationError):
    # OpenAI answers a spent quota with 429 insufficient_quota; retrying cannot help before
    # the window resets, so clients are told not to retry.
    code, status, type = "budget_exhausted", 429, "insufficient_quota"
    default_message = "The budget for this window is spent."
    should_retry = False


class Overloaded(ApplicationError):
    code, status, type = "overloaded", 503, "server_error"
    default_message = "The platform is overloaded; retry after the time in Retry-After."


class BackendUnavailable(ApplicationError):
    code, status, type = "backend_unavailable", 503, "server_error"
    default_message = "No backend can serve this request right now."


class CircuitOpen(BackendUnavailable):
    code = "circuit_open"


class Timeout(ApplicationError):
    code, status, type = "timeout", 504, "server_error"
    default_message = "The request timed out."


def error_body(*, message: str, type: str, code: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "code": code, "param": param}}


def error_body_for(exc: ApplicationError) -> dict:
    return error_body(message=exc.message, type=exc.type, code=exc.code, param=exc.param)


def error_headers(exc: ApplicationError) -> dict[str, str]:
    headers = dict(exc.headers)
    if exc.retry_after is not None:
        headers["Retry-After"] = str(max(1, int(exc.retry_after)))
    if exc.should_retry is not None:
        headers["x-should-retry"] = "true" if exc.should_retry else "false"
    return headers


class MethodNotAllowed(InvalidRequest):
    code, status = "method_not_allowed", 405
    default_message = "This method is not allowed here."


class UnsupportedMediaType(InvalidRequest):
    code, status = "unsupported_media_type", 415
    default_message = "Send a JSON body with Content-Type: application/json."


class ModelNotFound(NotFound):
    # OpenAI's code, which clients match on.
    code = "model_not_found"
    default_message = "The model does not exist or you do not have access to it."


def _all_subclasses(cls: type) -> list[type]:
    return [cls, *(s for sub in cls.__subclasses__() for s in _all_subclasses(sub))]


def error_from_code(code: str, message: str | None = None, *, param: str | None = None,
                    retry_after: int | None = None) -> ApplicationError:
    """Rebuild an error that crossed a process boundary as its code (engine, worker, stream)."""
    by_code: dict[str, type[ApplicationError]] = {}
    for error_class in _all_subclasses(ApplicationError):
        # The most general class of a code: a subclass may add its own constructor (e.g. a
        # refused model's), which a message alone cannot build.
        by_code.setdefault(error_class.code, error_class)
    cls = by_code.get(code, ApplicationError)
    return cls(message, param=param, retry_after=retry_after)
