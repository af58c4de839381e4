"""Parse and validate OpenAI request bodies into typed requests.

Like OpenAI's own API, an argument we do not recognise is a 400 (silently ignoring a
parameter would return something the client did not ask for), and so is a recognised one set
to a value we cannot honour (audio, predictions). Every refusal names the parameter in
`param`. Chat messages are parsed in messages.py, tools and response formats in tools.py; a
request that needs what no backend of its model supports is refused by the router.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from routing.wire import fields
from routing.wire.messages import message_images, messages_parse
from routing.wire.tools import ToolUse, tool_use_parse
from tenants.errors import InvalidRequest

MAX_N = 16
MAX_STOP = 4
MAX_TOP_LOGPROBS = 20
MAX_LEGACY_LOGPROBS = 5
MAX_SEED = 2**63 - 1
MAX_BATCH_INPUTS = 256


@dataclass(frozen=True, slots=True)
class Sampling:
    """What every generation request shares."""

    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    n: int
    stop: tuple[str, ...]
    seed: int | None
    logprobs: int | None  # None: none; 0: the chosen token's; k: also the top k
    min_tokens: int = 0
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class ChatRequest:
    model: str
    messages: list[dict]  # see routing/wire/messages.py
    sampling: Sampling
    stream: bool
    include_usage: bool
    cache_salt: str = ""  # vLLM's: separates prefix caches further within the caller's tenant
    tool_use: ToolUse = ToolUse()
    # The body as another wire format sent it (Anthropic's Messages): a backend speaking that
    # format is sent it as it came (routing/wire/anthropic.py); None: OpenAI's chat.
    native: dict | None = None

    @property
    def features(self) -> frozenset[str]:
        """What a backend must support to serve it (router.FEATURES)."""
        use, needs = self.tool_use, set()
        if use.tools or any(m.get("tool_calls") or m.get("role") == "tool" for m in self.messages):
            needs.add("tools")
        if use.response_format is not None:
            needs.add(use.response_format["type"])  # json_object | json_schema
        if any(message_images(m) for m in self.messages):
            needs.add("vision")
        return frozenset(needs)


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    model: str
    prompts: list[str | list[int]]
    sampling: Sampling
    stream: bool
    include_usage: bool
    echo: bool
    cache_salt: str = ""


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    model: str
    inputs: list[str | list[int]]
    encoding_format: str = "float"
    extra: dict[str, Any] = field(default_factory=dict)


# --- shared sampling ------------------------------------------------------------------------------

COMMON = {
    "model",
    "stream",
    "stream_options",
    "temperature",
    "top_p",
    "n",
    "stop",
    "seed",
    "user",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "top_k",
    "min_tokens",
    "ignore_eos",
    "repetition_penalty",
    "metadata",
    "store",
    "service_tier",
    "cache_salt",
}
MAX_CACHE_SALT = 256


def _cache_salt(body: dict) -> str:
    """vLLM's `cache_salt`: requests share cached prompt blocks only with the same salt (and,
    here, always only within the caller's tenant)."""
    salt = body.get("cache_salt")
    if salt is None:
        return ""
    if not isinstance(salt, str) or not 0 < len(salt) <= MAX_CACHE_SALT:
        raise InvalidRequest(
            f"'cache_salt' must be a non-empty string of up to {MAX_CACHE_SALT} characters.",
            param="cache_salt",
        )
    return salt


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if (
        not isinstance(stop, list)
        or len(stop) > MAX_STOP
        or not all(isinstance(s, str) and s for s in stop)
    ):
        raise InvalidRequest(
            f"'stop' must be a non-empty string or an array of up to {MAX_STOP} non-empty strings.",
            param="stop",
        )
    return tuple(stop)


def _stream(body: dict) -> tuple[bool, bool]:
    stream = fields.boolean(body, "stream", False)
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise InvalidRequest(
            "'stream_options' is only allowed when 'stream' is true.", param="stream_options"
        )
    if not isinstance(options, dict) or set(options) - {"include_usage", "continuous_usage_stats"}:
        raise InvalidRequest(
            "'stream_options' must be an object with 'include_usage'.", param="stream_options"
        )
    return stream, fields.boolean(options, "include_usage", False)


MAX_LOGIT_BIAS = 300
TOKEN_ID = re.compile(r"[0-9]{1,10}")


def _logit_bias(body: dict) -> tuple[tuple[int, float], ...]:
    """OpenAI's {"<token id>": bias in [-100, 100]}, at most 300 entries."""
    bias = body.get("logit_bias")
    if bias is None:
        return ()
    if not isinstance(bias, dict) or len(bias) > MAX_LOGIT_BIAS:
        raise InvalidRequest(
            f"'logit_bias' must be an object of up to {MAX_LOGIT_BIAS} token ids.",
            param="logit_bias",
        )
    pairs = []
    for token, value in bias.items():
        # ASCII digits only: str.isdigit() also takes "²" and "١", which int() refuses or reads.
        if (
            not TOKEN_ID.fullmatch(token)
            or isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not -100 <= value <= 100
        ):
            raise InvalidRequest(
                "'logit_bias' maps token ids to numbers from -100 to 100.", param="logit_bias"
            )
        pairs.append((int(token), float(value)))
    return tuple(sorted(pairs))


def _sampling(body: dict, *, max_tokens: int | None, logprobs: int | None) -> Sampling:
    if body.get("user") is not None:
        fields.string(body, "user")
    fields.unsupported_unless(body, "service_tier", ["auto", "default"])
    n = fields.integer(body, "n", low=1, high=MAX_N, default=1)
    return Sampling(
        max_tokens=max_tokens,
        temperature=fields.number(body, "temperature", low=0.0, high=2.0, default=1.0),
        top_p=fields.number(body, "top_p", low=0.0, high=1.0, default=1.0, low_open=True),
        top_k=fields.integer(body, "top_k", low=-1, high=1_000_000, default=0),
        n=n,
        stop=_stop(body),
        seed=fields.integer(body, "seed", low=-(2**63), high=MAX_SEED, default=None),
        logprobs=logprobs,
        min_tokens=fields.integer(body, "min_tokens", low=0, high=1_000_000, default=0),
        ignore_eos=fields.boolean(body, "ignore_eos", False),
        presence_penalty=fields.number(body, "presence_penalty", low=-2.0, high=2.0, default=0.0),
        frequency_penalty=fields.number(body, "frequency_penalty", low=-2.0, high=2.0, default=0.0),
        repetition_penalty=fields.number(
            body, "repetition_penalty", low=0.0, high=2.0, default=1.0, low_open=True
        ),
        logit_bias=_logit_bias(body),
    )


# --- chat ---------------------------------------------------------------------------------

CHAT_KNOWN = COMMON | {
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "response_format",
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "parallel_tool_calls",
    "modalities",
    "reasoning_effort",
    "prediction",
    "audio",
    "web_search_options",
}


def chat_request_parse(body: Any) -> ChatRequest:
    body = fields.json_object(body)
    fields.reject_unknown(body, CHAT_KNOWN)
    model = fields.string(body, "model", required=True)
    messages = messages_parse(body)
    tool_use = tool_use_parse(body)
    fields.unsupported_unless(body, "modalities", [["text"]])
    for name in ("audio", "prediction", "web_search_options", "reasoning_effort"):
        fields.unsupported_unless(body, name, [])
    max_tokens = fields.integer(body, "max_completion_tokens", low=1, high=10_000_000, default=None)
    if max_tokens is None:
        max_tokens = fields.integer(body, "max_tokens", low=1, high=10_000_000, default=None)
    logprobs = None
    if fields.boolean(body, "logprobs", False):
        logprobs = fields.integer(body, "top_logprobs", low=0, high=MAX_TOP_LOGPROBS, default=0)
    elif body.get("top_logprobs") is not None:
        raise InvalidRequest("'top_logprobs' requires 'logprobs' to be true.", param="top_logprobs")
    stream, include_usage = _stream(body)
    return ChatRequest(
        model=model,
        messages=messages,
        sampling=_sampling(body, max_tokens=max_tokens, logprobs=logprobs),
        stream=stream,
        include_usage=include_usage,
        cache_salt=_cache_salt(body),
        tool_use=tool_use,
    )


# --- completions -------------------------------------------------------------------------------

COMPLETION_KNOWN = COMMON | {"prompt", "max_tokens", "logprobs", "echo", "suffix", "best_of"}


def _token_ids(value: Any) -> list[int] | None:
    """Token ids as ints, or None if `value` is not a non-empty array of them (7.0 is an
    integer in JSON terms, as fields.integer reads a scalar)."""
    if not isinstance(value, list) or not value:
        return None
    ids = []
    for token in value:
        if (
            isinstance(token, float)
            and token.is_integer()
            and (abs(token) <= fields.EXACT_FLOAT_INT)
        ):
            token = int(token)
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            return None
        ids.append(token)
    return ids


def _inputs(value: Any, param: str) -> list[str | list[int]]:
    """A string, an array of strings, an array of token ids, or an array of those arrays."""
    items: list[str | list[int]]
    if isinstance(value, str):
        items = [value]
    elif (ids := _token_ids(value)) is not None:
        items = [ids]
    elif (
        isinstance(value, list)
        and value
        and all(isinstance(v, str) or _token_ids(v) is not None for v in value)
    ):
        items = [v if isinstance(v, str) else _token_ids(v) or [] for v in value]
    else:
        raise InvalidRequest(
            f"'{param}' must be a string, an array of strings, or token ids.", param=param
        )
    if len(items) > MAX_BATCH_INPUTS:
        raise InvalidRequest(f"At most {MAX_BATCH_INPUTS} inputs per request.", param=param)
    if any(item == "" for item in items):
        raise InvalidRequest(f"'{param}' must not be empty.", param=param)
    return items


def completion_request_parse(body: Any) -> CompletionRequest:
    body = fields.json_object(body)
    fields.reject_unknown(body, COMPLETION_KNOWN)
    model = fields.string(body, "model", required=True)
    if "prompt" not in body:
        raise InvalidRequest("Missing required parameter: 'prompt'.", param="prompt")
    prompts = _inputs(body["prompt"], "prompt")
    if body.get("suffix"):
        raise InvalidRequest("'suffix' is not supported by this server.", param="suffix")
    n = fields.integer(body, "n", low=1, high=MAX_N, default=1)
    fields.integer(
        body, "best_of", low=n, high=n, default=n
    )  # best_of > n would need hidden samples
    logprobs = fields.integer(body, "logprobs", low=0, high=MAX_LEGACY_LOGPROBS, default=None)
    stream, include_usage = _stream(body)
    max_tokens = fields.integer(body, "max_tokens", low=1, high=10_000_000, default=16)
    return CompletionRequest(
        model=model,
        prompts=prompts,
        sampling=_sampling(body, max_tokens=max_tokens, logprobs=logprobs),
        stream=stream,
        include_usage=include_usage,
        echo=fields.boolean(body, "echo", False),
        cache_salt=_cache_salt(body),
    )


# --- embeddings --------------------------------------------------------------------------------

EMBEDDING_KNOWN = {"model", "input", "encoding_format", "dimensions", "user"}


def embedding_request_parse(body: Any) -> EmbeddingRequest:
    body = fields.json_object(body)
    fields.reject_unknown(body, EMBEDDING_KNOWN)
    model = fields.string(body, "model", required=True)
    if "input" not in body:
        raise InvalidRequest("Missing required parameter: 'input'.", param="input")
    inputs = _inputs(body["input"], "input")
    encoding = body.get("encoding_format")
    if encoding is None:
        encoding = "float"
    elif not isinstance(encoding, str) or encoding not in {"float", "base64"}:
        raise InvalidRequest(
            "'encoding_format' must be 'float' or 'base64'.", param="encoding_format"
        )
    dimensions = fields.integer(body, "dimensions", low=1, high=1_000_000, default=None)
    if body.get("user") is not None:
        fields.string(body, "user")
    return EmbeddingRequest(
        model=model,
        inputs=inputs,
        encoding_format=encoding,
        extra={"dimensions": dimensions} if dimensions else {},
    )
