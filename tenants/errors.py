"""Application errors: one class per failure, each with a stable code, mapped once to HTTP and
the OpenAI error body `{"error": {"message", "type", "code", "param"}}`.

Every app raises these (or its own subclasses). One function renders them for HTTP
(`tenants.apis.errors.error_response`: the DRF exception handler, the /v1 API, the 404/500
pages) and one for websocket frames (`routing.consumers.error_frame`), both from the body
`error_body_for` builds.
"""

from __future__ import annotations

from typing import Any

from django.db import InterfaceError, OperationalError
from psycopg_pool import PoolTimeout

# What a reachable database would not raise (a connection ended, the pool empty): worth a retry,
# answered 503 with Retry-After wherever a request meets it.
DATABASE_TRANSIENT = (OperationalError, InterfaceError, PoolTimeout)


class ApplicationError(Exception):
    code = "internal_error"
    status = 500
    type = "server_error"
    default_message = "The server had an error while processing your request."
    # Sent as x-should-retry so OpenAI's clients do not retry what cannot succeed.
    should_retry: bool | None = None
    # Whether the router may try this request again, here or on another backend, by default.
    retryable: bool = False
    # A backend reporting this error means the client must hear it (its own mistake, a
    # content filter): never retried elsewhere, where it would fail or be laundered too.
    surfaced: bool = False

    def __init__(
        self,
        message: str | None = None,
        *,
        param: str | None = None,
        retry_after: float | None = None,
        headers: dict[str, str] | None = None,
        retryable: bool | None = None,
        backend: str | None = None,
        backend_code: str = "",
        detail: str = "",
    ) -> None:
        """`backend`: the backend that failed (None: not a backend's failure); `backend_code`:
        the platform's code for what it reported, which the client's code may generalise (a
        provider's rate limit is the client's backend_unavailable, the router's wait);
        `detail`: what it said, for logs and operators only, never sent to the client."""
        self.message = message or self.default_message
        self.param = param
        self.retry_after = retry_after
        self.headers: dict[str, str] = dict(headers or {})  # extra response headers
        if retryable is not None:
            self.retryable = retryable
        self.backend, self.detail = backend, detail
        self.backend_code = backend_code or self.code
        super().__init__(self.message)

    def replace(self, **changes: Any) -> ApplicationError:
        """A copy with `changes` (message, param, retry_after, headers, retryable, backend,
        backend_code, detail): errors are never changed once raised."""
        fields = {
            "message": self.message,
            "param": self.param,
            "retry_after": self.retry_after,
            "headers": self.headers,
            "retryable": self.retryable,
            "backend": self.backend,
            "backend_code": self.backend_code,
            "detail": self.detail,
        }
        copy = BaseException.__new__(type(self))
        ApplicationError.__init__(copy, **{**fields, **changes})
        copy.__dict__.update({k: v for k, v in self.__dict__.items() if k not in copy.__dict__})
        return copy

    @property
    def is_backend_failure(self) -> bool:
        """Counts against the backend's circuit breaker: a fault, not the client's mistake
        nor a wait the backend asked for."""
        return (
            self.backend is not None and not self.surfaced and self.backend_code != "rate_limited"
        )


class InvalidRequest(ApplicationError):
    code, status, type = "invalid_request", 400, "invalid_request_error"
    default_message = "The request is not valid."
    surfaced = True


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
    # The window that refused the hold (its exhaustion alert; never sent to the client).
    window_id: int | None = None


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


class ServiceUnavailable(ApplicationError):
    """One of our own stores (the database, Redis) did not answer: nothing was charged or
    sent; retrying shortly helps."""

    code, status, type = "service_unavailable", 503, "server_error"
    default_message = "The service is briefly unavailable; retry after the time in Retry-After."


def error_body(*, message: str, type: str, code: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "code": code, "param": param}}


def error_body_for(exc: ApplicationError) -> dict[str, Any]:
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


def _all_subclasses(cls: type[ApplicationError]) -> list[type[ApplicationError]]:
    return [cls, *(s for sub in cls.__subclasses__() for s in _all_subclasses(sub))]


def error_class(code: str) -> type[ApplicationError]:
    """The most general class of an error code (ApplicationError for an unknown one)."""
    by_code: dict[str, type[ApplicationError]] = {}
    for cls in _all_subclasses(ApplicationError):
        by_code.setdefault(cls.code, cls)
    return by_code.get(code, ApplicationError)


def error_from_code(code: str, message: str | None = None, **fields: Any) -> ApplicationError:
    """Rebuild an error that crossed a process boundary as its code (engine, worker, stream);
    `fields` as ApplicationError's constructor takes them."""
    # Not the class's own constructor: a subclass's may need what a code cannot carry.
    cls = error_class(code)
    error = BaseException.__new__(cls)
    ApplicationError.__init__(error, message, **fields)
    return error
