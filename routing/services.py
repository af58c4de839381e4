"""The /v1 request path shared by HTTP (JSON and SSE) and websockets: parse, admit, dispatch,
and turn the run's events into OpenAI objects."""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from channels.db import database_sync_to_async
from django.conf import settings

from routing.overload import load_admit
from routing.backends import Call, Route
from routing.dispatch import Attempt, Served, routes_walk
from routing.ratelimit import Admitted, limiter_get, scopes_for
from routing.router import Need, Plan, registry_get, route_plan
from routing.admission import (
    Caller, engine_sampling, max_tokens_resolve,
)
from routing.wire import parse
from routing.wire.render import ChatFormat, CompletionFormat, embeddings_response
from tenants.errors import (
    ApplicationError, BackendUnavailable, InvalidRequest, ModelNotFound, error_body_for,
    error_from_code,
)
from tenants.models import UsageRecord
from workers.generation import GenerationJob, generation_settle_partial
from workers.registry import ModelInfo, model_tokenizer, model_vocab_size, usage_cost
from workers.transport import StreamTimeout

logger = logging.getLogger(__name__)


@dataclass
class Started:
    """A request the engine has accepted, with the formatter for its answer."""

    job: GenerationJob
    format: ChatFormat | None
    events: AsyncIterator[dict]
    stream: bool
    include_usage: bool
    admitted: Admitted | None  # None: nothing to give back (a replayed cascade answer)
    brownout: str = ""  # the x-fairlane-brownout header, when the brownout changed the request
    backend: str = ""  # the backend serving it (x-fairlane-backend)
    cascade: str = ""  # the tier that answered and its confidence (x-fairlane-cascade)


def _error(event: dict) -> ApplicationError:
    return error_from_code(event["code"], event["message"], param=event.get("param"))


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


def _prompt_texts(kind: str, request) -> tuple[list[dict], str | list]:
    """What a remote backend is sent: the messages, or the prompt as given (token ids and
    batches only reach backends sharing our tokenizers; see router.route_supports)."""
    if kind == "chat":
        return request.messages, ""
    prompts = request.prompts
    return [], prompts[0] if len(prompts) == 1 else prompts


def _worst_prompt_tokens(messages: list[dict], prompt: str | list) -> int:
    """No tokenizer at hand (a remote-only model): every token is at least one byte, plus the
    chat format's few tokens per message; token ids count as themselves."""
    prompts = prompt if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) \
        else [prompt]
    tokens = sum(len(p) if isinstance(p, list) else len(p.encode()) for p in prompts)
    return tokens + len("".join(m["content"] for m in messages).encode()) \
        + 8 * (len(messages) + 1)


class _Generation:
    """One request between parsing and dispatch: what each route would be sent and cost."""

    def __init__(self, caller: Caller, kind: str, request) -> None:
        self.caller, self.kind, self.request = caller, kind, request
        self.sampling = request.sampling
        self.request_id = uuid.uuid4().hex
        self.lane = caller.agent.lane or caller.tenant.default_lane
        self.messages, self.prompt = _prompt_texts(kind, request)
        self.registry = registry_get()
        routes = self.registry.routes.get(request.model)
        if not routes or not caller.agent.may_use_model(request.model):
            raise ModelNotFound(f"The model '{request.model}' does not exist or you do not "
                                "have access to it.", param="model")
        self.local = next((r for r in routes if r.backend.is_local), None)
        self.tokenizer, self.token_prompts, self.local_max = None, None, 0
        self.brownout = ""
        if self.local is not None:
            self._local_prepare(remote_too=len(routes) > 1)
        token_ids = kind == "completion" and (len(request.prompts) > 1 or any(
            isinstance(p, list) for p in request.prompts))
        self.remote_prompt_tokens = _worst_prompt_tokens(self.messages, self.prompt)
        self.num_prompts = len(self.token_prompts) if self.token_prompts else 1
        remote = [r for r in routes if not r.backend.is_local]
        worst_max = max([self.local_max] + [self._remote_max(r) for r in remote])
        self.need = Need(kind=kind, prompt_tokens=self._prompt_tokens(None),
                         max_tokens=worst_max,
                         max_tokens_set=self.sampling.max_tokens is not None,
                         n=self.sampling.n, token_prompts=token_ids,
                         logit_bias=bool(self.sampling.logit_bias),
                         logprobs=self.sampling.logprobs is not None,
                         tenant=str(caller.tenant.pk),
                         prefix=("".join(m["content"] for m in self.messages)
                                 or str(self.prompt))[:512])
        self.first_plan = plan = self.plan()
        if plan.unsupported:
            raise InvalidRequest(f"No backend serving '{request.model}' supports this request "
                                 "(token-id or batched prompts, logit_bias and completion "
                                 "logprobs need the model's own tokenizer).")
        self._jobs: dict[str, GenerationJob] = {}

    def _local_prepare(self, *, remote_too: bool) -> None:
        info, request = self.local.info, self.request
        tokenizer = model_tokenizer(info)
        try:
            if self.kind == "chat":
                prompts = [_chat_prompt(tokenizer, request.messages)]
            else:
                prompts = _completion_prompts(info, tokenizer, request.prompts, "prompt")
        except InvalidRequest:
            if not remote_too:
                raise
            self.local = None  # e.g. no chat template here: the remote backends may have one
            return
        self.tokenizer, self.token_prompts = tokenizer, prompts
        self.local_max = max_tokens_resolve(info=info, prompts=prompts,
                                            max_tokens=self.sampling.max_tokens)

    def _prompt_tokens(self, route: Route | None) -> int:
        if route is not None and route.backend.is_local:
            return sum(len(p) for p in self.token_prompts)
        if self.token_prompts and route is None:
            return max(sum(len(p) for p in self.token_prompts), self.remote_prompt_tokens)
        return self.remote_prompt_tokens

    def _remote_max(self, route: Route | None) -> int:
        if self.sampling.max_tokens is not None:
            return self.sampling.max_tokens
        context = route.backend.context_length if route is not None else 0
        if context:
            return max(context - self.remote_prompt_tokens // 4, 1)
        return settings.FAIRLANE_DEFAULT_MAX_TOKENS

    def max_tokens(self, route: Route) -> int:
        return self.local_max if route.backend.is_local else self._remote_max(route)

    def plan(self) -> Plan:
        return route_plan(registry=registry_get(), agent_id=str(self.caller.agent.pk),
                          model=self.request.model, need=self.need)

    def cost(self, route: Route) -> int:
        return usage_cost(route.info, prompt_tokens=self._prompt_tokens(route),
                          completion_tokens=self.num_prompts * self.sampling.n
                          * self.max_tokens(route))

    def job(self, route: Route) -> GenerationJob:
        if route.backend.name not in self._jobs:
            caller = self.caller
            self._jobs[route.backend.name] = GenerationJob(
                request_id=self.request_id, kind="generate", model=route.info.to_dict(),
                prompts=self.token_prompts if route.backend.is_local else [],
                n=self.sampling.n, sampling=engine_sampling(self.sampling, self.max_tokens(route)),
                tenant_id=caller.tenant.pk, agent_id=str(caller.agent.pk),
                lane=self.lane, weight=caller.tenant.weight)
        return self._jobs[route.backend.name]

    def call(self, route: Route) -> Call:
        return Call(kind=self.kind, upstream=route.upstream, sampling=self.sampling,
                    max_tokens=self.max_tokens(route), messages=self.messages,
                    prompt=self.prompt, wants_logprobs=self.sampling.logprobs is not None)

    def local_ready(self, route: Route, has_next: bool) -> None:
        """Raises to skip the local engine for the next backend: its queue is full, or (with
        another backend to go to) no GPU worker hosting the model is up."""
        caller = self.caller
        if has_next and settings.FAIRLANE_ENGINE_MODE == "celery" and not _hosted(route.model):
            raise BackendUnavailable(f"No GPU worker hosts '{route.model}' now.")
        try:
            self.local_max, self.brownout = load_admit(
                info=route.info, lane=self.lane, tenant=str(caller.tenant.pk),
                max_tokens=self.local_max)
        except ApplicationError as exc:
            exc.retryable = has_next
            raise
        self._jobs.pop(route.backend.name, None)  # the brownout may have capped max_tokens

    def attempt(self, admitted: Admitted) -> Attempt:
        caller = self.caller
        return Attempt(request_id=self.request_id, tenant=caller.tenant, agent=caller.agent,
                       api_key=caller.api_key, job_for=self.job, call_for=self.call,
                       cost_for=self.cost, local_ready=self.local_ready)

    def worst_tokens(self) -> int:
        return self.need.prompt_tokens + self.num_prompts * self.sampling.n * self.need.max_tokens

    def started(self, served: Served, admitted: Admitted | None, *,
                wants_logprobs: bool | None = None) -> Started:
        request, sampling = self.request, self.sampling
        if wants_logprobs is None:
            wants_logprobs = sampling.logprobs is not None
        num_choices = self.num_prompts * sampling.n
        is_local = served.route.backend.is_local
        common = {"request_id": self.request_id, "model": request.model,
                  "num_choices": num_choices, "tokenizer": self.tokenizer if is_local else None,
                  "wants_logprobs": wants_logprobs}
        if self.kind == "chat":
            formatter = ChatFormat(**common)
        else:
            echo = None
            if request.echo:
                texts = [p if isinstance(p, str) else self.tokenizer.decode(p)
                         for p in request.prompts]
                echo = [texts[i // sampling.n] for i in range(num_choices)]
            formatter = CompletionFormat(prompt_texts=echo, **common)
        return Started(job=served.job, format=formatter, events=served.events,
                       stream=request.stream, include_usage=request.include_usage,
                       admitted=admitted, brownout=self.brownout if is_local else "",
                       backend=served.route.backend.name)


_live_models: tuple[float, set[str]] = (0.0, set())


def _hosted(model: str) -> bool:
    """Whether a live GPU worker advertises the model (heartbeats, read at most once a second)."""
    global _live_models
    checked, names = _live_models
    if time.monotonic() - checked > 1.0:
        from workers.worker import workers_live

        names = {name for beat in workers_live() for name in beat["models"]}
        _live_models = (time.monotonic(), names)
    return model in names


def _admit_generation(caller: Caller, kind: str, request) -> tuple[_Generation, Admitted]:
    """Everything before dispatch (synchronous: database and tokenizer work)."""
    generation = _Generation(caller, kind, request)
    admitted = limiter_get().acquire(request_id=generation.request_id,
                                     scopes=scopes_for(caller), tokens=generation.worst_tokens())
    return generation, admitted


async def _start(caller: Caller, kind: str, request, admission=None,
                 ) -> tuple[_Generation, Served, Admitted]:
    generation, admitted = admission or await database_sync_to_async(_admit_generation)(
        caller, kind, request)
    try:
        served = await routes_walk(generation.attempt(admitted), generation.plan,
                                   generation.first_plan)
    except BaseException:
        limiter_get().release(admitted, tokens_used=0)
        raise
    return generation, served, admitted


def _admit_or_tiers(caller: Caller, kind: str, request):
    """One hop for the usual request: its admission; the cascade's tiers when the agent has
    a cascade listing the model asked for."""
    tiers = _cascade_tiers(caller, request.model)
    return tiers if len(tiers) > 1 else _admit_generation(caller, kind, request)


async def generation_start(*, caller: Caller, kind: str, body) -> Started:
    request = (parse.chat_request_parse(body) if kind == "chat"
               else parse.completion_request_parse(body))
    admission = await database_sync_to_async(_admit_or_tiers)(caller, kind, request)
    if isinstance(admission, list):
        for tier in admission[:-1]:
            started = await _cascade_try(caller, kind, request, tier)
            if started is not None:
                return started
        request, admission = dataclasses.replace(request, model=admission[-1]), None
    generation, served, admitted = await _start(caller, kind, request, admission)
    return generation.started(served, admitted)


def _cascade_tiers(caller: Caller, model: str) -> list[str]:
    """The agent's cascade when it lists the model asked for (cheapest first), else just it."""
    plan = registry_get().agents.get(str(caller.agent.pk))
    if plan is None or model not in plan.cascade:
        return [model]
    return [m for m in plan.cascade if caller.agent.may_use_model(m)] or [model]


async def _cascade_try(caller: Caller, kind: str, request, tier: str) -> Started | None:
    """Ask a cheaper tier, whole (not streamed), with log-probabilities; its answer if its
    mean token log-probability reaches the agent's threshold, else None (escalate). The
    tier's call is metered as its own ledger row (`<request id>` of that call)."""
    sampling = request.sampling
    if sampling.logprobs is None:
        sampling = dataclasses.replace(sampling, logprobs=0)
    try:
        generation, served, admitted = await _start(
            caller, kind, dataclasses.replace(request, model=tier, stream=False,
                                              sampling=sampling))
    except ApplicationError as exc:
        if exc.status < 500 and exc.code != "budget_exhausted":
            raise  # the client's own mistake reads the same on every tier
        return None
    started = generation.started(served, admitted)
    events = [event async for event in _events_to_end(started)]
    logprobs = [lp for e in events if e["type"] == "token" for lp in (e["logprobs"] or ())]
    done = next((e for e in events if e["type"] == "done"), None)
    if (not logprobs or done is None or done["status"] != UsageRecord.Status.OK
            or any(e["type"] == "error" for e in events)):
        return None
    mean = sum(logprobs) / len(logprobs)
    threshold = registry_get().agents[str(caller.agent.pk)].cascade_threshold
    logger.info("request %s: cascade tier %s mean logprob %.3f (threshold %.3f)",
                generation.request_id, tier, mean, threshold)
    if mean < threshold:
        return None
    replay = generation.started(served, None, wants_logprobs=request.sampling.logprobs is not None)
    replay.stream, replay.include_usage = request.stream, request.include_usage
    replay.events = _replayed(events)
    replay.cascade = f"{tier}; mean_logprob={mean:.4f}"
    return replay


async def _replayed(events: list[dict]) -> AsyncIterator[dict]:
    for event in events:
        yield event


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
        if started.admitted is not None:
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


class _Embedding:
    """An embeddings request between parsing and dispatch: the local engine's mean-pooled
    hidden states, or a remote backend with hidden states (another Fairlane, or an
    OpenAI-compatible embeddings endpoint), in the agent's chain order."""

    def __init__(self, caller: Caller, request) -> None:
        self.caller, self.request = caller, request
        self.request_id = uuid.uuid4().hex
        self.lane = caller.agent.lane or caller.tenant.default_lane
        if request.extra.get("dimensions"):
            raise InvalidRequest("'dimensions' is not supported: this model's embeddings have "
                                 "a fixed size.", param="dimensions")
        routes = registry_get().routes.get(request.model)
        if not routes or not caller.agent.may_use_model(request.model):
            raise ModelNotFound(f"The model '{request.model}' does not exist or you do not "
                                "have access to it.", param="model")
        self.local = next((r for r in routes if r.backend.is_local), None)
        self.token_prompts = None
        if self.local is not None:
            info = self.local.info
            self.token_prompts = _completion_prompts(info, model_tokenizer(info),
                                                     request.inputs, "input")
            max_tokens_resolve(info=info, prompts=self.token_prompts, max_tokens=0)
        texts = [i for i in request.inputs if isinstance(i, str)]
        self.remote_tokens = sum(_worst_prompt_tokens([], t) for t in texts) + sum(
            len(i) for i in request.inputs if isinstance(i, list))
        self.need = Need(kind="embed", prompt_tokens=self.remote_tokens,
                         token_prompts=len(texts) < len(request.inputs),
                         tenant=str(caller.tenant.pk))
        self.first_plan = self.plan()
        if self.first_plan.unsupported:
            raise InvalidRequest(f"No backend serving '{request.model}' returns embeddings.",
                                 param="model")
        self.admitted = limiter_get().acquire(request_id=self.request_id,
                                              scopes=scopes_for(caller),
                                              tokens=self._tokens(None))

    def _tokens(self, route: Route | None) -> int:
        if route is not None and route.backend.is_local or route is None and self.token_prompts:
            return sum(len(p) for p in self.token_prompts)
        return self.remote_tokens

    def plan(self) -> Plan:
        return route_plan(registry=registry_get(), agent_id=str(self.caller.agent.pk),
                          model=self.request.model, need=self.need)

    def cost(self, route: Route) -> int:
        return usage_cost(route.info, prompt_tokens=self._tokens(route), completion_tokens=0)

    def job(self, route: Route) -> GenerationJob:
        caller = self.caller
        return GenerationJob(request_id=self.request_id, kind="embed", model=route.info.to_dict(),
                             prompts=self.token_prompts if route.backend.is_local else [],
                             tenant_id=caller.tenant.pk, agent_id=str(caller.agent.pk),
                             lane=self.lane, weight=caller.tenant.weight)

    def call(self, route: Route) -> Call:
        return Call(kind="embed", upstream=route.upstream, sampling=None, max_tokens=0,
                    inputs=list(self.request.inputs))

    def local_ready(self, route: Route, has_next: bool) -> None:
        if has_next and settings.FAIRLANE_ENGINE_MODE == "celery" and not _hosted(route.model):
            raise BackendUnavailable(f"No GPU worker hosts '{route.model}' now.")
        load_admit(info=route.info, lane=self.lane, tenant=str(self.caller.tenant.pk),
                   max_tokens=0)

    def attempt(self) -> Attempt:
        caller = self.caller
        return Attempt(request_id=self.request_id, tenant=caller.tenant, agent=caller.agent,
                       api_key=caller.api_key, job_for=self.job, call_for=self.call,
                       cost_for=self.cost, local_ready=self.local_ready)


async def embeddings_create(*, caller: Caller, body) -> dict:
    request = parse.embedding_request_parse(body)
    embedding = await database_sync_to_async(_Embedding)(caller, request)
    try:
        served = await routes_walk(embedding.attempt(), embedding.plan, embedding.first_plan)
    except BaseException:
        limiter_get().release(embedding.admitted, tokens_used=0)
        raise
    started = Started(job=served.job, format=None, events=served.events, stream=False,
                      include_usage=False, admitted=embedding.admitted)
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
            return embeddings_response(model=request.model, vectors=vectors,
                                       usage=event["usage"],
                                       encoding_format=request.encoding_format)
    raise ApplicationError("The request ended without a result.")


def models_available(*, caller: Caller) -> list[str]:
    """Model names the agent may use that something can serve now: a remote backend that is
    not offline, the embedded engines, or a live GPU worker that advertises the model."""
    names = []
    for name, routes in registry_get().routes.items():
        if not caller.agent.may_use_model(name):
            continue
        for route in routes:
            if route.backend.is_local:
                usable = settings.FAIRLANE_ENGINE_MODE == "embedded" or _hosted(name)
            else:
                usable = route.backend.health != "offline"
            if usable:
                names.append(name)
                break
    return sorted(names)
