"""The /v1 request path shared by HTTP (JSON and SSE) and websockets: parse, admit, dispatch,
and turn the run's events into OpenAI objects."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from channels.db import database_sync_to_async

from routing.overload import load_admit
from routing.ratelimit import Admitted, limiter_get
from routing.admission import (
    Caller, engine_sampling, generation_admit, max_tokens_resolve, model_for, models_for,
)
from routing.wire import parse
from routing.wire.render import ChatFormat, CompletionFormat, embeddings_response
from tenants.errors import ApplicationError, InvalidRequest, error_body_for, error_from_code
from tenants.models import UsageRecord
from workers.generation import GenerationJob, generation_settle_partial
from workers.registry import ModelInfo, model_list_enabled, model_tokenizer, model_vocab_size
from workers.transport import StreamTimeout, dispatcher_get

logger = logging.getLogger(__name__)


@dataclass
class Started:
    """A request the engine has accepted, with the formatter for its answer."""

    job: GenerationJob
    format: ChatFormat | None
    events: AsyncIterator[dict]
    stream: bool
    include_usage: bool
    admitted: Admitted
    brownout: str = ""  # the x-fairlane-brownout header, when the brownout changed the request


def _error(event: dict) -> ApplicationError:
    return error_from_code(event["code"], event["message"], param=event.get("param"))


async def _dispatch(job: GenerationJob, admitted: Admitted) -> AsyncIterator[dict]:
    """The run's events after `accepted`; a refusal before it raises here, as a 4xx/5xx."""
    events = dispatcher_get().events(job)
    try:
        first = await anext(events)
    except BaseException:
        limiter_get().release(admitted, tokens_used=0)
        raise
    if first["type"] == "error":
        await events.aclose()
        limiter_get().release(admitted, tokens_used=0)
        raise _error(first)
    return events


def _chat_prompt(tokenizer, messages: list[dict]) -> list[int]:
    if not tokenizer.chat_template:
        raise InvalidRequest("This model has no chat template; use /v1/completions.",
                             param="model")
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    except Exception as exc:  # a template that refuses these messages (e.g. role order)
        raise InvalidRequest(f"The model's chat template rejected the messages: {exc}",
                             param="messages") from None
    return tokenizer.encode(text, add_special_tokens=False)


def _completion_prompts(info: ModelInfo, tokenizer, prompts: list, param: str) -> list[list[int]]:
    vocab = model_vocab_size(info)
    for prompt in prompts:
        if isinstance(prompt, list) and max(prompt) >= vocab:
            raise InvalidRequest(f"Token id {max(prompt)} is outside this model's vocabulary "
                                 f"(size {vocab}).", param=param)
    return [p if isinstance(p, list) else tokenizer.encode(p) for p in prompts]


def _admit_generation(caller: Caller, kind: str, body) -> Started:
    """Everything before dispatch (synchronous: database and tokenizer work)."""
    if kind == "chat":
        request = parse.chat_request_parse(body)
    else:
        request = parse.completion_request_parse(body)
    info = model_for(caller=caller, name=request.model)
    tokenizer = model_tokenizer(info)
    if kind == "chat":
        prompts = [_chat_prompt(tokenizer, request.messages)]
    else:
        prompts = _completion_prompts(info, tokenizer, request.prompts, "prompt")
    sampling = request.sampling
    max_tokens = max_tokens_resolve(info=info, prompts=prompts, max_tokens=sampling.max_tokens)
    max_tokens, brownout = load_admit(info=info, lane=caller.agent.effective_lane,
                                      tenant=str(caller.tenant.pk), max_tokens=max_tokens)
    job, admitted = generation_admit(caller=caller, info=info, prompts=prompts, kind="generate",
                                     n=sampling.n, sampling=engine_sampling(sampling, max_tokens))
    num_choices = len(prompts) * sampling.n
    common = {"request_id": job.request_id, "model": info.name, "num_choices": num_choices,
              "tokenizer": tokenizer, "wants_logprobs": sampling.logprobs is not None}
    if kind == "chat":
        formatter = ChatFormat(**common)
    else:
        echo = None
        if request.echo:
            texts = [p if isinstance(p, str) else tokenizer.decode(p) for p in request.prompts]
            echo = [texts[i // sampling.n] for i in range(num_choices)]
        formatter = CompletionFormat(prompt_texts=echo, **common)
    return Started(job=job, format=formatter, events=None, stream=request.stream,
                   include_usage=request.include_usage, admitted=admitted, brownout=brownout)


async def generation_start(*, caller: Caller, kind: str, body) -> Started:
    started = await database_sync_to_async(_admit_generation)(caller, kind, body)
    started.events = await _dispatch(started.job, started.admitted)
    return started


async def _events_to_end(started: Started) -> AsyncIterator[dict]:
    """The run's events; if its worker goes silent, end it here with an error, charging what
    was streamed (settlement is idempotent, so a late worker cannot charge twice)."""
    seen: list[dict] = []
    try:
        async for event in started.events:
            seen.append(event)
            yield event
    except StreamTimeout as exc:
        logger.warning("request %s: %s", started.job.request_id, exc.message)
        closing: list[dict] = []
        await database_sync_to_async(generation_settle_partial)(started.job, seen, backend="api",
                                                                emit=closing.append)
        for event in closing:
            seen.append(event)
            if event["type"] == "error":
                event.update(code=exc.code, message=exc.message)
            yield event
    finally:
        # The request's rate-limit slot is free again, and its unused tokens go back.
        limiter_get().release(started.admitted, tokens_used=_tokens_used(seen))


def _tokens_used(events: list[dict]) -> int:
    for event in events:
        if event["type"] == "done":
            return event["usage"]["prompt_tokens"] + event["usage"]["completion_tokens"]
    return sum(len(e["token_ids"]) for e in events if e["type"] == "token")


async def started_chunks(started: Started) -> AsyncIterator[dict]:
    """Chunk objects for a streamed answer; an error after the first token ends the stream
    with an `{"error": ...}` object (never a splice from elsewhere)."""
    fmt, usage_too = started.format, started.include_usage
    for chunk in fmt.opening(usage_too):
        yield chunk
    async for event in _events_to_end(started):
        kind = event["type"]
        if kind == "token":
            # Tokens that end mid-character carry no text yet; skip them unless their
            # logprobs were asked for (the text follows with the next token).
            if event["text"] or fmt.wants_logprobs:
                yield fmt.token_chunk(event, usage_too)
            else:
                fmt.choices[event["choice"]].token_ids += event["token_ids"]
        elif kind == "finish":
            yield fmt.finish_chunk(event, usage_too)
        elif kind == "error":
            yield error_body_for(_error(event))
        elif kind == "done" and usage_too:
            yield fmt.usage_chunk(event["usage"])


async def started_collect(started: Started) -> dict:
    """The whole answer as one object, or the run's error."""
    error = None
    async for event in _events_to_end(started):
        if event["type"] == "error":
            error = _error(event)
        elif event["type"] == "done":
            if error is not None:
                raise error
            if event["status"] == UsageRecord.Status.CANCELLED:
                raise ApplicationError("The request was cancelled.")
            return started.format.response(event["usage"])
        else:
            started.format.absorb(event)
    raise ApplicationError("The request ended without a result.")


def _admit_embedding(caller: Caller, body) -> tuple[GenerationJob, Admitted, str, str]:
    request = parse.embedding_request_parse(body)
    info = model_for(caller=caller, name=request.model)
    tokenizer = model_tokenizer(info)
    if request.extra.get("dimensions"):
        raise InvalidRequest("'dimensions' is not supported: this model's embeddings have a "
                             "fixed size.", param="dimensions")
    prompts = _completion_prompts(info, tokenizer, request.inputs, "input")
    max_tokens_resolve(info=info, prompts=prompts, max_tokens=0)
    load_admit(info=info, lane=caller.agent.effective_lane, tenant=str(caller.tenant.pk),
               max_tokens=0)
    job, admitted = generation_admit(caller=caller, info=info, prompts=prompts, kind="embed")
    return job, admitted, info.name, request.encoding_format


async def embeddings_create(*, caller: Caller, body) -> dict:
    job, admitted, model, encoding = await database_sync_to_async(_admit_embedding)(caller, body)
    events = await _dispatch(job, admitted)
    started = Started(job=job, format=None, events=events, stream=False, include_usage=False,
                      admitted=admitted)
    vectors: dict[int, str] = {}
    error = None
    async for event in _events_to_end(started):
        if event["type"] == "embedding":
            vectors[event["index"]] = event["b64"]
        elif event["type"] == "error":
            error = _error(event)
        elif event["type"] == "done":
            if error is not None:
                raise error
            return embeddings_response(model=model, vectors=vectors, usage=event["usage"],
                                       encoding_format=encoding)
    raise ApplicationError("The request ended without a result.")


def models_available(*, caller: Caller) -> list[ModelInfo]:
    """Enabled models the agent may use and something can serve now: the embedded engines, or
    a live GPU worker that advertises the model."""
    from django.conf import settings

    enabled = model_list_enabled()
    if settings.FAIRLANE_ENGINE_MODE == "celery":
        from workers.worker import workers_live

        hosted = {name for beat in workers_live() for name in beat["models"]}
        enabled = [m for m in enabled if m.name in hosted]
    return models_for(caller=caller, available=enabled)
