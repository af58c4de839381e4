"""Chat and completions: parse, admit (rate limits), plan the routes, walk them (budgets held
per backend); the agent's cascade is in cascade.py."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from routing.admission import Caller, sampling_for_engine
from routing.attempts import Offer, Offers, attempt_release
from routing.backends import Call, Route
from routing.backends.base import call_streams
from routing.dispatch import Served, offer_first_prepare
from routing.max_tokens import max_tokens_local, max_tokens_remote
from routing.metrics import request_arrived
from routing.models import BackendKind
from routing.overload import load_admit
from routing.router import Need, registry_get
from routing.services.answers import Started
from routing.services.cascade import cascade_run
from routing.services.local_tools import (
    local_guide,
    local_messages,
    tool_call_events,
    tools_active,
)
from routing.services.prepare import (
    Routed,
    chat_prompt,
    completion_prompts,
    prompt_texts,
    tenant_cache_salt,
    worst_prompt_tokens,
)
from routing.services.request_logs import log_input
from routing.sync import db_call
from routing.wire import parse
from routing.wire.anthropic import cache_control_used
from routing.wire.messages import message_text
from routing.wire.render import ChatFormat, CompletionFormat
from routing.wire.tools import ToolUse
from tenants.errors import ApplicationError, InvalidRequest
from workers.engine import Tokenizer
from workers.serving.catalog import model_tokenizer, usage_cost
from workers.serving.events import Event
from workers.serving.jobs import Job
from workers.serving.runtime import Runtime
from workers.serving.settlement import settlement_track
from workers.serving.versions import version_choose, version_fingerprint

logger = logging.getLogger(__name__)
# What a request needing a feature no backend of its model has is told, and its param.
FEATURE_NAMES = {
    "tools": "tools (function calling)",
    "json_object": "response_format json_object (JSON mode)",
    "json_schema": "response_format json_schema (structured outputs)",
    "vision": "image inputs",
}
FEATURE_PARAMS = {
    "tools": "tools",
    "json_object": "response_format",
    "json_schema": "response_format",
    "vision": "messages",
}


class _Generation(Routed):
    """Chat or completions between parsing and dispatch: what each route would be sent and
    cost."""

    def __init__(self, runtime: Runtime, caller: Caller, endpoint: str, request) -> None:
        super().__init__(runtime, caller, request.model)
        self.endpoint, self.request = endpoint, request
        self.sampling = request.sampling
        self.messages, self.prompt = prompt_texts(endpoint, request)
        routes = self.routes
        self.tokenizer: Tokenizer | None = None
        self.token_prompts: list[list[int]] | None = None  # our engine's prompts, when it may serve
        self.local_max = 0
        self.tool_use = request.tool_use if endpoint == "chat" else ToolUse()
        features = request.features if endpoint == "chat" else frozenset()
        if self.local is not None and not features <= self.local.features:
            self.local = None  # tools, JSON schemas, images: not for our engine (yet)
        self.guide = local_guide(self.tool_use)
        if self.local is not None:
            self._local_prepare(self.local, remote_too=len(routes) > 1)
        token_ids = endpoint == "completion" and (
            len(request.prompts) > 1 or any(isinstance(p, list) for p in request.prompts)
        )
        self.remote_prompt_tokens = worst_prompt_tokens(self.messages, self.prompt, self.tool_use)
        self.num_prompts = len(self.token_prompts) if self.token_prompts else 1
        remote = [r for r in routes if not r.backend.is_local]
        worst_max = max([self.local_max] + [self._remote_max(r) for r in remote])
        self.need = Need(
            endpoint=endpoint,
            prompt_tokens=self._prompt_tokens(None),
            max_tokens=worst_max,
            max_tokens_set=self.sampling.max_tokens is not None,
            n=self.sampling.n,
            token_prompts=token_ids,
            logit_bias=bool(self.sampling.logit_bias),
            logprobs=self.sampling.logprobs is not None,
            tenant=str(caller.tenant.pk),
            features=features,
            prefix=("".join(message_text(m) for m in self.messages) or str(self.prompt))[:512],
        )
        self.first_plan = plan = self.plan()
        if plan.missing:
            raise InvalidRequest(
                f"No backend serving '{request.model}' supports {FEATURE_NAMES[plan.missing]}.",
                param=FEATURE_PARAMS[plan.missing],
            )
        if plan.unsupported:
            raise InvalidRequest(
                f"No backend serving '{request.model}' supports this request "
                "(token-id or batched prompts, logit_bias and completion "
                "logprobs need the model's own tokenizer; tools, JSON modes "
                "and images need a backend that supports each)."
            )
        self.first_offers: Offers | None = None  # set by the admission, the first prepared

    def _local_prepare(self, local: Route, *, remote_too: bool) -> None:
        info, request = local.info, self.request
        tokenizer = model_tokenizer(info)
        try:
            if self.endpoint == "chat":
                native = tools_active(self.tool_use) and tokenizer.template_has_tools
                prompts = [
                    chat_prompt(
                        tokenizer,
                        local_messages(request.messages, self.tool_use, native=native),
                        tools=list(self.tool_use.tools) if native else None,
                    )
                ]
            else:
                prompts = completion_prompts(info, tokenizer, request.prompts, "prompt")
        except InvalidRequest:
            if not remote_too:
                raise
            self.local = None  # e.g. no chat template here: the remote backends may have one
            return
        self.tokenizer, self.token_prompts = tokenizer, prompts
        self.local_max = max_tokens_local(
            info=info, prompts=prompts, asked=self.sampling.max_tokens
        )

    def _prompt_tokens(self, route: Route | None) -> int:
        if route is not None and route.backend.is_local:
            return sum(len(p) for p in self.token_prompts or ())
        if self.token_prompts and route is None:
            return max(sum(len(p) for p in self.token_prompts), self.remote_prompt_tokens)
        return self.remote_prompt_tokens

    def _remote_max(self, route: Route | None) -> int:
        return max_tokens_remote(
            asked=self.sampling.max_tokens,
            context_length=route.backend.context_length if route else 0,
            worst_prompt_tokens=self.remote_prompt_tokens,
        )

    def offer(self, route: Route, *, has_next: bool) -> Offer:
        """The local engine: its readiness now (the brownout may cap max_tokens) and the job it
        runs; a remote backend: the call it is sent. Both: the worst-case cost."""
        refusal, brownout, call = None, "", None
        if route.backend.is_local:
            max_tokens = self.local_max
            try:
                self.local_pool_check(route, has_next)
                max_tokens, brownout = self._local_load(route, has_next)
            except ApplicationError as exc:
                refusal = exc
        else:
            max_tokens = self._remote_max(route)
            call = Call(
                endpoint=self.endpoint,
                upstream=route.upstream,
                sampling=self.sampling,
                max_tokens=max_tokens,
                messages=self.messages,
                prompt=self.prompt,
                wants_logprobs=self.sampling.logprobs is not None,
                tool_use=self.tool_use,
                stream=call_streams(
                    client_streams=self.request.stream, spec=route.backend, max_tokens=max_tokens
                ),
                cache_salt=tenant_cache_salt(
                    tenant_id=self.caller.tenant.pk, salt=self.request.cache_salt
                ),
                native=self._native(route),
            )
        caller = self.caller
        job = Job(
            request_id=self.request_id,
            task="generate",
            model=version_choose(route.info, key=self.conversation_key()).to_dict(),
            prompts=(self.token_prompts or []) if call is None else [],
            n=self.sampling.n,
            sampling=sampling_for_engine(self.sampling, max_tokens, self.guide),
            tenant_id=caller.tenant.pk,
            agent_id=str(caller.agent.pk),
            lane=self.lane,
            weight=caller.tenant.weight,
            cache_salt=self.request.cache_salt,
        )
        cost = usage_cost(
            route.info,
            prompt_tokens=self._prompt_tokens(route),
            completion_tokens=self.num_prompts * self.sampling.n * max_tokens,
            # A prompt that asks to be cached may be written to the cache whole, at its price.
            cache_write_tokens=self._prompt_tokens(route)
            if call is not None and cache_control_used(call.native)
            else 0,
        )
        return Offer(route=route, job=job, call=call, cost=cost, refusal=refusal, brownout=brownout)

    def _native(self, route: Route) -> dict | None:
        """The body as its wire format sent it, for a backend speaking that format."""
        if self.endpoint != "chat" or route.backend.kind != BackendKind.ANTHROPIC:
            return None
        return self.request.native

    def _local_load(self, route: Route, has_next: bool) -> tuple[int, str]:
        """The local queue's admission under its load: max_tokens (capped in a brownout) and
        the brownout header; a refusal falls through only with another backend to go to."""
        try:
            return load_admit(
                pool=self.runtime.pool,
                info=route.info,
                lane=self.lane,
                tenant=str(self.caller.tenant.pk),
                max_tokens=self.local_max,
            )
        except ApplicationError as exc:
            raise exc.replace(retryable=has_next) from None

    def conversation_key(self) -> str:
        """A conversation's canary version sticks to it: its tenant and first two messages
        (or its prompt's beginning); "" (a random version) when there is no text to key."""
        start = (
            "".join(message_text(m) for m in self.messages[:2])
            if self.messages
            else str(self.prompt or "")
        )[:512]
        return f"{self.caller.tenant.pk}\x00{start}" if start else ""

    def worst_tokens(self) -> int:
        return self.need.prompt_tokens + self.num_prompts * self.sampling.n * self.need.max_tokens

    def started(
        self, served: Served, *, replay: bool = False, wants_logprobs: bool | None = None
    ) -> Started:
        """Its answer from the served events; `replay`: a cascade tier's answer replayed,
        its rate-limit slot already given back."""
        request, sampling = self.request, self.sampling
        if wants_logprobs is None:
            wants_logprobs = sampling.logprobs is not None
        num_choices = self.num_prompts * sampling.n
        is_local = served.route.backend.is_local
        common = {
            "request_id": self.request_id,
            "model": request.model,
            "num_choices": num_choices,
            "tokenizer": self.tokenizer if is_local else None,
            "wants_logprobs": wants_logprobs,
            "fingerprint": version_fingerprint(served.job.model) if is_local else None,
        }
        if self.endpoint == "chat":
            formatter = ChatFormat(**common)
        else:
            echo = None
            if request.echo:
                tokenizer = self.tokenizer
                texts = [
                    p if isinstance(p, str) else _decoded(tokenizer, p) for p in request.prompts
                ]
                echo = [texts[i // sampling.n] for i in range(num_choices)]
            formatter = CompletionFormat(prompt_texts=echo, **common)
        events: AsyncIterator[Event] = served.events
        if is_local and tools_active(self.tool_use):  # calls come as text from our engine
            events = tool_call_events(events, self.tool_use)
        return Started(
            runtime=self.runtime,
            job=served.job,
            format=formatter,
            events=events,
            stream=request.stream,
            include_usage=request.include_usage,
            admitted=None if replay else self.admitted,
            brownout=served.offer.brownout,
            demoted=self.soft.demoted,
            backend=served.route.backend.name,
            log_input=log_input(endpoint=self.endpoint, request=request),
        )


def _admit_generation(runtime: Runtime, caller: Caller, endpoint: str, request) -> _Generation:
    """Everything before dispatch (synchronous: database and tokenizer work): the rate-limit
    slot, the offers, and the first offer's budget reservation in the same hop."""
    generation = _Generation(runtime, caller, endpoint, request)
    generation.admitted = runtime.limiter.acquire(
        request_id=generation.request_id,
        scopes=generation.limit_scopes(),
        tokens=generation.worst_tokens(),
    )
    try:
        generation.first_offers = generation.offers(generation.first_plan)
    except BaseException:
        runtime.limiter.release(generation.admitted, tokens_used=0)
        raise
    offer_first_prepare(generation.attempt, generation.first_offers)
    return generation


async def _start(
    runtime: Runtime, caller: Caller, endpoint: str, request
) -> tuple[_Generation, Served]:
    """One cascade tier: its admission, then its walk."""
    generation = await _admission(_admit_generation, runtime, caller, endpoint, request)
    return generation, await generation.walk(generation.first_offers)


async def _admission(admit, *args):
    """Run an admission hop. A client that leaves meanwhile cancels the request, not the hop:
    what the hop still takes (rate-limit slots, the first route's budget hold) is given back
    when it ends, rather than held until it expires."""
    hop = asyncio.ensure_future(db_call(admit)(*args))
    try:
        return await asyncio.shield(hop)
    except asyncio.CancelledError:
        hop.add_done_callback(_abandoned)
        raise


def _abandoned(hop: asyncio.Future) -> None:
    if hop.cancelled() or hop.exception() is not None or isinstance(hop.result(), _Cascade):
        return
    settlement_track(db_call(_give_back)(hop.result()))


def _give_back(generation: _Generation) -> None:
    generation.runtime.limiter.release(generation.admitted, tokens_used=0)
    attempt_release(generation.attempt)


@dataclass(frozen=True, slots=True)
class _Cascade:
    """The agent's cascade lists the model asked for: its tiers, cheapest first."""

    tiers: list[str]
    threshold: float


def _admit_or_tiers(
    runtime: Runtime, caller: Caller, endpoint: str, request
) -> _Generation | _Cascade:
    """One hop for the usual request: its admission; the cascade's tiers and threshold when
    the agent has a cascade listing the model asked for."""
    tiers, threshold = _cascade_tiers(caller, request.model)
    if len(tiers) > 1:
        return _Cascade(tiers, threshold)
    return _admit_generation(runtime, caller, endpoint, request)


async def generation_start(*, runtime: Runtime, caller: Caller, endpoint: str, body) -> Started:
    request_arrived()  # the start of its time to first token (routing/metrics.py)
    request = (
        parse.chat_request_parse(body)
        if endpoint == "chat"
        else parse.completion_request_parse(body)
    )
    return await request_start(runtime=runtime, caller=caller, endpoint=endpoint, request=request)


async def request_start(*, runtime: Runtime, caller: Caller, endpoint: str, request) -> Started:
    """A parsed request (any front door's) admitted, routed and walked to its first answer."""
    admitted = await _admission(_admit_or_tiers, runtime, caller, endpoint, request)
    if isinstance(admitted, _Cascade):
        return await cascade_run(
            runtime, caller, endpoint, request, admitted.tiers, admitted.threshold, start=_start
        )
    return admitted.started(await admitted.walk(admitted.first_offers))


def _decoded(tokenizer: Tokenizer | None, token_ids: list[int]) -> str:
    """A token-id prompt as text, for echo; such prompts reach only our engine's routes
    (the plan refuses them elsewhere), which have the tokenizer."""
    if tokenizer is None:
        raise InvalidRequest(
            "echo of token-id prompts needs the model's own tokenizer.", param="echo"
        )
    return tokenizer.decode(token_ids)


def _cascade_tiers(caller: Caller, model: str) -> tuple[list[str], float]:
    """The agent's cascade when it lists the model asked for (cheapest first), else just it;
    and its threshold. Synchronous (the registry may be read from the database)."""
    plan = registry_get().agents.get(str(caller.agent.pk))
    if plan is None or model not in plan.cascade:
        return [model], 0.0
    tiers = [m for m in plan.cascade if caller.agent.may_use_model(m)] or [model]
    return tiers, plan.cascade_threshold
