"""One protocol for every backend: its capabilities, a cheap health probe, and a streamed
call that yields the platform's generation events (see workers/serving/events.py), so the /v1
renderers do not care where tokens came from.

An adapter raises the ApplicationError its client would see for anything that went wrong
(routing/errors.py `backend_error`: the backend's name and its own words beside it); the
error's `surfaced` says whether the client must hear it (bad input, a content filter) or
another backend may be tried (an outage, a 429).
"""

from __future__ import annotations

import email.utils
import json
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import orjson
from django.conf import settings

from routing.errors import backend_error
from routing.models import BackendKind
from routing.wire.parse import Sampling
from routing.wire.tools import ToolUse
from tenants.errors import ApplicationError
from workers.serving.catalog import ModelInfo

# What a chat request may need beyond text (ChatRequest.features), and who has it unless the
# operator says otherwise (Backend.supports_*, per model BackendModel.supports_*). vLLM
# serves JSON schemas out of the box; tool parsing and images depend on its flags and model.
FEATURES = ("tools", "json_object", "json_schema", "vision")
KIND_FEATURES: dict[str, frozenset[str]] = {
    BackendKind.OPENAI: frozenset(FEATURES),
    BackendKind.OPENROUTER: frozenset(FEATURES),
    BackendKind.ANTHROPIC: frozenset(FEATURES),
    BackendKind.OPENAI_COMPATIBLE: frozenset({"json_object", "json_schema"}),
}
# Our engine: JSON mode, schemas and tool calls by guided decoding (workers/engine/guide.py,
# routing/services/local_tools.py); images not yet.
LOCAL_FEATURES = frozenset({"tools", "json_object", "json_schema"})
FLAGS = {
    "tools": ("tools",),
    "json_schema": ("json_object", "json_schema"),
    "vision": ("vision",),
}  # supports_<flag> -> the features it turns on or off


def features_resolve(default: frozenset[str], row) -> frozenset[str]:
    """`default` changed by the row's `supports_<flag>` flags (None: unchanged)."""
    features = set(default)
    for flag, named in FLAGS.items():
        value = getattr(row, f"supports_{flag}", None)
        if value is not None:
            (features.update if value else features.difference_update)(named)
    return frozenset(features)


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """A Backend row, detached from the ORM (the router keeps a snapshot in memory)."""

    name: str
    kind: str
    base_url: str = ""
    credential_ref: str = ""
    credential_encrypted: str = ""
    context_length: int = 0
    hidden_states: bool = False
    accelerator: str = "gpu"
    max_concurrency: int = 0
    continuous_batching: bool = False
    paged_kv: bool = False
    zone: str = ""
    energy_mj_per_token: int = 0
    carbon_g_per_kwh: int = 0
    lease_seconds: int = 0
    queue_depth: int = 0
    timeout_seconds: float = 60.0
    health: str = "unknown"
    probe_p95_ms: float = 0.0
    supports_tools: bool | None = None  # None: the kind's default (KIND_FEATURES)
    supports_json_schema: bool | None = None
    supports_vision: bool | None = None

    @property
    def is_local(self) -> bool:
        return self.kind == BackendKind.LOCAL

    @property
    def features(self) -> frozenset[str]:
        if self.is_local:
            return LOCAL_FEATURES
        return features_resolve(KIND_FEATURES.get(self.kind, frozenset()), self)

    def capabilities(self) -> dict:
        return {
            "context_length": self.context_length,
            "hidden_states": self.hidden_states,
            "accelerator": self.accelerator,
            "max_concurrency": self.max_concurrency,
            "continuous_batching": self.continuous_batching,
            "paged_kv": self.paged_kv,
            "zone": self.zone,
            "features": sorted(self.features),
        }


@dataclass(frozen=True, slots=True)
class Route:
    """One way to serve a model: a backend, its name for the model, and its prices."""

    backend: BackendSpec
    model: str
    upstream: str
    info: ModelInfo
    model_features: frozenset[str] | None = None  # None: the backend's

    @property
    def features(self) -> frozenset[str]:
        return self.backend.features if self.model_features is None else self.model_features

    @property
    def is_paid(self) -> bool:
        info = self.info
        return bool(
            info.price_input_per_mtok or info.price_output_per_mtok or info.price_cached_per_mtok
        )


@dataclass(slots=True)
class Call:
    """What a remote backend is asked: OpenAI-shaped, translated by each adapter."""

    endpoint: str  # "chat" | "completion" | "embed"
    upstream: str
    sampling: Sampling | None
    max_tokens: int
    messages: list[dict] = field(default_factory=list)
    prompt: str | list = ""  # completions: text, token ids, or a batch of either
    wants_logprobs: bool = False
    inputs: list = field(default_factory=list)  # embeddings
    # The tenant's prefix-cache salt, hashed (never the tenant id in clear): remote engines
    # that honour it (vLLM, another Fairlane) never share cached prompts between tenants.
    cache_salt: str = ""
    tool_use: ToolUse = field(default_factory=ToolUse)  # chat: tools and response_format
    traceparent: str = ""  # the request's trace, for backends of our own (workers/serving/trace.py)
    stream: bool = True  # False: asked for the whole answer in one body (call_streams)
    native: dict | None = None  # an Anthropic Messages body, for an Anthropic backend as it is

    @property
    def generation_sampling(self) -> Sampling:
        """The sampling of a chat or text completion (only an embedding call has none)."""
        if self.sampling is None:
            raise TypeError(f"a {self.endpoint} call without sampling cannot generate")
        return self.sampling


def call_streams(*, client_streams: bool, spec: BackendSpec, max_tokens: int) -> bool:
    """Whether a call is streamed upstream. Always for a client that streams. For one that
    does not, only when the whole answer might not arrive within the backend's timeout (which
    bounds the wait for a response's first byte, and a stream's between chunks) from a backend
    as slow as FAIRLANE_WHOLE_ANSWER_TOKENS_PER_SECOND. A whole answer is one body to read
    where a stream is a chunk per token; a client leaving before it arrives is, as before a
    stream's first token, charged nothing."""
    rate = settings.FAIRLANE_WHOLE_ANSWER_TOKENS_PER_SECOND
    return client_streams or rate <= 0 or max_tokens > spec.timeout_seconds * rate


def body_json(body: dict) -> bytes:
    """A request body as JSON (orjson; the stdlib's encoder for what orjson refuses: a lone
    surrogate the client's JSON escaped, which the stdlib escapes again)."""
    try:
        return orjson.dumps(body)
    except TypeError:  # orjson.JSONEncodeError
        return json.dumps(body).encode()


def retry_after_parse(headers) -> float | None:
    """Seconds to wait from `retry-after-ms` (OpenAI's, more precise) or `Retry-After`
    (seconds or an HTTP date)."""
    value = headers.get("retry-after-ms")
    if value:
        try:
            return max(float(value) / 1000, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value) if value else None
        return max(parsed.timestamp() - time.time(), 0.0) if parsed else None


def error_for_status(
    status: int, message: str, retry_after: float | None, *, backend: str
) -> ApplicationError:
    """A backend's HTTP error status as the error its client would see."""
    if status == 429:
        return backend_error(
            "rate_limited", message, backend=backend, status=status, retry_after=retry_after
        )
    if status in (400, 413, 422):
        return backend_error("invalid_request", message, backend=backend, status=status)
    if status in (401, 403):  # our credential is wrong: the operator's problem, not the client's
        return backend_error(
            "backend_unavailable",
            f"authentication failed: {message}",
            backend=backend,
            status=status,
        )
    if status in (408, 504):
        return backend_error(
            "timeout", message, backend=backend, status=status, retry_after=retry_after
        )
    return backend_error(
        "backend_unavailable", message, backend=backend, status=status, retry_after=retry_after
    )


def estimate_tokens(text: str) -> int:
    """An upper-bound-leaning count for text we have no tokenizer for: byte-level BPE
    tokenizers average about 4 bytes per English token; never zero for non-empty text."""
    return max(math.ceil(len(text.encode()) / 4), 1 if text else 0)


async def models_probe(client, url: str, headers: dict[str, str], timeout, *, backend: str) -> None:
    """GET <base>/v1/models: free on every provider, and it checks the credential too."""
    response = await client.get(url.rstrip("/") + "/v1/models", headers=headers, timeout=timeout)
    if response.status_code >= 400:
        raise error_for_status(
            response.status_code,
            response.text[:200],
            retry_after_parse(response.headers),
            backend=backend,
        )


async def sse_lines(response: httpx.Response) -> AsyncIterator[bytes]:
    """An event stream's lines as bytes, without their line ends (LF or CRLF; a lone CR
    splits a line too, as the SSE format allows). httpx's aiter_lines decodes every chunk to
    text and splits it in Python; the adapters only look for `data:` and `event:` and hand
    the rest to json.loads, which takes bytes."""
    pending = b""
    async for piece in response.aiter_bytes():
        *lines, pending = (pending + piece).split(b"\n")
        for line in lines:
            for part in line.removesuffix(b"\r").split(b"\r"):
                yield part
    if pending:
        for part in pending.removesuffix(b"\r").split(b"\r"):
            yield part
