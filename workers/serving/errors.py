"""The request path's own failures between the GPU workers and the API: a request's stream
that went silent or whose Redis failed (the transport raises them; the API settles what was
streamed and answers with them)."""

from tenants.errors import BackendUnavailable, Timeout


class StreamTimeout(Timeout):
    pass


class StreamLost(BackendUnavailable):
    """Redis failed under a request's stream (restarted, unreachable): what was streamed is
    settled, the rest of the stream is gone."""

    default_message = "The request's stream was interrupted; retry it."
