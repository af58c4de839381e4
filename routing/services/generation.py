"""Chat and completions: parse, admit (rate limits), plan the routes, walk them (budgets held
per backend); the agent's cascade is in cascade.py."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from django.conf import settings

from routing.admission import Caller, engine_sampling, max_tokens_resolve
from routing.attempts import Attempt, attempt_release
from routing.backends import Call, Route
from routing.dispatch import Served, route_first_prepare, routes_walk
from routing.metrics import request_arrived
from routing.overload import load_admit
from routing.ratelimit import Admitted, limiter_get, scopes_for
from routing.router import Need, registry_get
from routing.services.answers import Started
from routing.services.cascade import cascade_run
from routing.services.local_tools import (
    local_guide, local_messages, tool_call_events, tools_active,
)
from routing.services.prepare import (
    Routed, chat_prompt, completion_prompts, prompt_texts, tenant_cache_salt,
    worst_prompt_tokens,
)
from routing.sync import db_call
from routing.wire import parse
from routing.wire.messages import message_text
from routing.wire.tools import ToolUse
from routing.wire.render import ChatFormat, CompletionFormat
from tenants.errors import ApplicationError, InvalidRequest
from workers.generation import GenerationJob
from workers.registry import model_tokenizer, usage_cost
from workers.settlement import settlement_track
from workers.versions import version_choose, version_fingerprint

logger = logging.getLogger(__name__)
# What a request needing a feature no backend of its model has is told, and its param.
FEATURE_NAMES = {"tools": "tools (function calling)",
                 "json_object": "response_format json_object (JSON mode)",
                 "json_schema": "response_format json_schema (structured outputs)",
                 "vision": "image inputs"}
FEATURE_PARAMS = {"tools": "tools", "json_object": "response_format",
                  "json_schema": "response_format", "vision": "messages"}


class _Generation(Routed):
    """Chat or completions between parsing and dispatch: what each route would be sent and
    cost."""

    def __init__(self, caller: Caller, kind: str, request) -> None:
        super().__init__(caller, request.model)
        self.kind, self.request = kind, request
        self.sampling = request.sampling
        self.messages, self.prompt = prompt_texts(kind, request)
        routes = self.routes
        self.tokenizer, self.token_prompts, self.local_max = None, None, 0
        self.brownout = ""
        self.tool_use = request.tool_use if kind == "chat" else ToolUse()
        features = request.features if kind == "chat" else frozenset()
        if self.local is not None and not features <= self.local.features:
            self.local = None  # tools, JSON schemas, images: not for our engine (yet)
        self.guide = local_guide(self.tool_use)
        if self.local is not None:
            self._local_prepare(remote_too=len(routes) > 1)
        token_ids = kind == "completion" and (len(request.prompts) > 1 or any(
            isinstance(p, list) for p in request.prompts))
        self.remote_prompt_tokens = worst_prompt_tokens(self.messages, self.prompt,
                                                        self.tool_use)
        self.num_prompts = len(self.token_prompts) if self.token_prompts else 1
        remote = [r for r in routes if not r.backend.is_local]
        worst_max = max([self.local_max] + [self._remote_max(r) for r in remote])
        self.need = Need(kind=kind, prompt_tokens=self._prompt_tokens(None),
                         max_tokens=worst_max,
                         max_tokens_set=self.sampling.max_tokens is not None,
                         n=self.sampling.n, token_prompts=token_ids,
                         logit_bias=bool(self.sampling.logit_bias),
                         logprobs=self.sampling.logprobs is not None,
                         tenant=str(caller.tenant.pk), features=features,
                         prefix=("".join(message_text(m) for m in self.messages)
                                 or str(self.prompt))[:512])
        self.first_plan = plan = self.plan()
        if plan.missing:
            raise InvalidRequest(f"No backend serving '{request.model}' supports "
                                 f"{FEATURE_NAMES[plan.missing]}.",
                                 param=FEATURE_PARAMS[plan.missing])
        if plan.unsupported:
            raise InvalidRequest(f"No backend serving '{request.model}' supports this request "
                                 "(token-id or batched prompts, logit_bias and completion "
                                 "logprobs need the model's own tokenizer; tools, JSON modes "
                                 "and images need a backend that supports each).")
        self._jobs: dict[str, GenerationJob] = {}
        self.walk: Attempt | None = None  # set by the admission, its first route prepared

    def _local_prepare(self, *, remote_too: bool) -> None:
        info, request = self.local.info, self.request
        tokenizer = model_tokenizer(info)
        try:
            if self.kind == "chat":
                native = tools_active(self.tool_use) and tokenizer.template_has_tools
                prompts = [chat_prompt(
                    tokenizer, local_messages(request.messages, self.tool_use, native=native),
                    tools=self.tool_use.tools if native else None)]
            else:
                prompts = completion_prompts(info, tokenizer, request.prompts, "prompt")
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

    def cost(self, route: Route) -> int:
        return usage_cost(route.info, prompt_tokens=self._prompt_tokens(route),
                          completion_tokens=self.num_prompts * self.sampling.n
                          * self.max_tokens(route))

    def job(self, route: Route) -> GenerationJob:
        if route.backend.name not in self._jobs:
            caller = self.caller
            self._jobs[route.backend.name] = GenerationJob(
                request_id=self.request_id, kind="generate",
                model=version_choose(route.info, key=self.conversation_key()).to_dict(),
                prompts=self.token_prompts if route.backend.is_local else [],
                n=self.sampling.n, sampling=self._engine_sampling(route),
                tenant_id=caller.tenant.pk, agent_id=str(caller.agent.pk),
                lane=self.lane, weight=caller.tenant.weight,
                cache_salt=self.request.cache_salt)
        return self._jobs[route.backend.name]

    def conversation_key(self) -> str:
        """A conversation's canary version sticks to it: its tenant and first two messages
        (or its prompt's beginning); "" (a random version) when there is no text to key."""
        start = ("".join(message_text(m) for m in self.messages[:2]) if self.messages
                 else str(self.prompt or ""))[:512]
        return f"{self.caller.tenant.pk}\x00{start}" if start else ""

    def _engine_sampling(self, route: Route) -> dict:
        return {**engine_sampling(self.sampling, self.max_tokens(route)), **self.guide}

    def call(self, route: Route) -> Call:
        return Call(kind=self.kind, upstream=route.upstream, sampling=self.sampling,
                    max_tokens=self.max_tokens(route), messages=self.messages,
                    prompt=self.prompt, wants_logprobs=self.sampling.logprobs is not None,
                    tool_use=self.tool_use,
                    cache_salt=tenant_cache_salt(tenant_id=self.caller.tenant.pk,
                                                 salt=self.request.cache_salt))

    def local_ready(self, route: Route, has_next: bool) -> None:
        """Raises to skip the local engine for the next backend: its queue is full, or (with
        another backend to go to) no GPU worker hosting the model is up."""
        caller = self.caller
        self.local_pool_check(route, has_next)
        try:
            self.local_max, self.brownout = load_admit(
                info=route.info, lane=self.lane, tenant=str(caller.tenant.pk),
                max_tokens=self.local_max)
        except ApplicationError as exc:
            exc.retryable = has_next
            raise
        self._jobs.pop(route.backend.name, None)  # the brownout may have capped max_tokens

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
                  "wants_logprobs": wants_logprobs,
                  "fingerprint": version_fingerprint(served.job.model) if is_local else None}
        if self.kind == "chat":
            formatter = ChatFormat(**common)
        else:
            echo = None
            if request.echo:
                texts = [p if isinstance(p, str) else self.tokenizer.decode(p)
                         for p in request.prompts]
                echo = [texts[i // sampling.n] for i in range(num_choices)]
            formatter = CompletionFormat(prompt_texts=echo, **common)
        events = served.events
        if is_local and tools_active(self.tool_use):  # calls come as text from our engine
            events = tool_call_events(events, self.tool_use)
        return Started(job=served.job, format=formatter, events=events,
                       stream=request.stream, include_usage=request.include_usage,
                       admitted=admitted, brownout=self.brownout if is_local else "",
                       backend=served.route.backend.name)


def _admit_generation(caller: Caller, kind: str, request) -> tuple[_Generation, Admitted]:
    """Everything before dispatch (synchronous: database and tokenizer work), and the first
    route's budget hold in the same hop."""
    generation = _Generation(caller, kind, request)
    admitted = limiter_get().acquire(request_id=generation.request_id,
                                     scopes=scopes_for(caller), tokens=generation.worst_tokens())
    generation.walk = generation.attempt()
    route_first_prepare(generation.walk, generation.first_plan)
    return generation, admitted


async def _start(caller: Caller, kind: str, request,
                 admission: tuple[_Generation, Admitted] | None = None,
                 ) -> tuple[_Generation, Served, Admitted]:
    generation, admitted = admission or await _admission(_admit_generation, caller, kind,
                                                         request)
    try:
        served = await routes_walk(generation.walk, generation.plan, generation.first_plan)
    except BaseException:
        limiter_get().release(admitted, tokens_used=0)
        raise
    return generation, served, admitted


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
    settlement_track(db_call(_give_back)(*hop.result()))


def _give_back(generation: _Generation, admitted: Admitted) -> None:
    limiter_get().release(admitted, tokens_used=0)
    if generation.walk is not None:
        attempt_release(generation.walk)


@dataclass(frozen=True, slots=True)
class _Cascade:
    """The agent's cascade lists the model asked for: its tiers, cheapest first."""

    tiers: list[str]
    threshold: float


def _admit_or_tiers(caller: Caller, kind: str, request
                    ) -> tuple[_Generation, Admitted] | _Cascade:
    """One hop for the usual request: its admission; the cascade's tiers and threshold when
    the agent has a cascade listing the model asked for."""
    tiers, threshold = _cascade_tiers(caller, request.model)
    if len(tiers) > 1:
        return _Cascade(tiers, threshold)
    return _admit_generation(caller, kind, request)


async def generation_start(*, caller: Caller, kind: str, body) -> Started:
    request_arrived()  # the start of its time to first token (routing/metrics.py)
    request = (parse.chat_request_parse(body) if kind == "chat"
               else parse.completion_request_parse(body))
    match await _admission(_admit_or_tiers, caller, kind, request):
        case _Cascade(tiers=tiers, threshold=threshold):
            return await cascade_run(caller, kind, request, tiers, threshold, start=_start)
        case admission:
            generation, served, admitted = await _start(caller, kind, request, admission)
            return generation.started(served, admitted)


def _cascade_tiers(caller: Caller, model: str) -> tuple[list[str], float]:
    """The agent's cascade when it lists the model asked for (cheapest first), else just it;
    and its threshold. Synchronous (the registry may be read from the database)."""
    plan = registry_get().agents.get(str(caller.agent.pk))
    if plan is None or model not in plan.cascade:
        return [model], 0.0
    tiers = [m for m in plan.cascade if caller.agent.may_use_model(m)] or [model]
    return tiers, plan.cascade_threshold
