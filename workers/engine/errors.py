"""Plain exceptions the engine raises; the worker maps them to the platform's error codes.

Each carries a stable ``code`` (the platform's error vocabulary) and, for bad input, the
``param`` that was wrong, so the API layer can build an OpenAI error body without parsing text.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base of every error the engine raises on purpose."""

    code = "engine_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequest(EngineError, ValueError):
    """The caller sent something the engine cannot run (empty prompt, bad sampling value...)."""

    code = "invalid_request"


class ContextLengthExceeded(InvalidRequest):
    """Prompt (plus requested output) does not fit the model's context."""

    code = "context_length_exceeded"


class UnsupportedModel(EngineError):
    """A checkpoint uses an architecture feature this engine does not implement."""

    code = "unsupported_model"


class OutOfBlocks(EngineError):
    """Internal: the KV pool has no free block. The scheduler checks first, so users never see
    it."""

    code = "overloaded"


class EngineStopped(EngineError):
    """The engine loop is not running (shut down, or it failed); retry on another worker."""

    code = "backend_unavailable"
