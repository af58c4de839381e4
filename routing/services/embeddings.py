"""Embeddings: the local engine's pooled hidden states, or a remote backend with hidden
states (another Fairlane, an OpenAI-compatible embeddings endpoint), in chain order."""

from __future__ import annotations

import uuid

from channels.db import database_sync_to_async
from django.conf import settings

from routing.admission import Caller, max_tokens_resolve
from routing.backends import Call, Route
from routing.dispatch import Attempt, routes_walk
from routing.overload import load_admit
from routing.ratelimit import limiter_get, scopes_for
from routing.router import Need, Plan, registry_get, route_plan
from routing.services.answers import Started, event_error, events_to_end
from routing.services.prepare import completion_prompts, model_hosted, worst_prompt_tokens
from routing.wire import parse
from routing.wire.render import embeddings_response
from tenants.errors import ApplicationError, BackendUnavailable, InvalidRequest, ModelNotFound
from workers.generation import GenerationJob
from workers.registry import model_tokenizer, usage_cost


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
            self.token_prompts = completion_prompts(info, model_tokenizer(info),
                                                     request.inputs, "input")
            max_tokens_resolve(info=info, prompts=self.token_prompts, max_tokens=0)
        texts = [i for i in request.inputs if isinstance(i, str)]
        self.remote_tokens = sum(worst_prompt_tokens([], t) for t in texts) + sum(
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
        if has_next and settings.FAIRLANE_ENGINE_MODE == "celery" and not model_hosted(route.model):
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
    async for event in events_to_end(started):
        if event["type"] == "embedding":
            vectors[event["index"]] = event["b64"]
        elif event["type"] == "error":
            error = event_error(event)
        elif event["type"] == "done":
            if error is not None:
                raise error
            return embeddings_response(model=request.model, vectors=vectors,
                                       usage=event["usage"],
                                       encoding_format=request.encoding_format)
    raise ApplicationError("The request ended without a result.")
