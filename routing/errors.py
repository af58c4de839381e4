"""What the routing path tells clients when a backend fails: a stable code and a generic
message, never a backend's name, URL, credential reference or a provider's own words (a
provider's message can name its upstream model, account or host). The detail goes to the log
with the request id, and to the backend's `last_error` in the admin."""

from __future__ import annotations

from tenants.errors import ApplicationError, error_from_code

# Per code: what a client is told, whoever failed.
CLIENT_MESSAGES = {
    "backend_unavailable": "The model's backend is unavailable right now; retry later.",
    "timeout": "The model's backend did not answer in time; retry later.",
    "rate_limited": "The model's backend is rate limited right now; retry after the time in "
                    "Retry-After.",
    "invalid_request": "The model's backend refused this request as invalid; check its "
                       "parameters.",
    "context_length_exceeded": "The prompt and max_tokens do not fit this model's context.",
    "content_filtered": "The request was refused by a content filter.",
    # One of our own stores failed (the queue's Redis): not the backend's fault.
    "service_unavailable": "The service is briefly unavailable; retry shortly.",
}
MID_STREAM = "The answer was interrupted by its backend after it started; what was streamed " \
             "is billed."
# Codes a client must hear (not retried elsewhere): its own mistakes and content filters.
SURFACED = {"invalid_request", "context_length_exceeded", "content_filtered"}


def client_code(code: str) -> str:
    """The platform's code for what a backend reported (surfaced ones, timeouts and rate
    limits keep theirs; anything else is backend_unavailable)."""
    return code if code in CLIENT_MESSAGES else "backend_unavailable"


def client_error(code: str, *, retryable: bool = False) -> ApplicationError:
    """The error a client sees for a backend's failure with this code."""
    code = client_code(code)
    error = error_from_code(code, CLIENT_MESSAGES[code])
    error.retryable = retryable
    return error


class ServiceUnavailable(ApplicationError):
    """One of our own stores (the database, Redis) did not answer: nothing was charged or
    sent; retrying shortly helps."""

    code, status, type = "service_unavailable", 503, "server_error"
    default_message = "The service is briefly unavailable; retry after the time in Retry-After."
