"""Embeddings: the local engine's pooled hidden states, or a remote backend with hidden
states (another Fairlane, an OpenAI-compatible embeddings endpoint), in chain order."""

from __future__ import annotations

from channels.db import database_sync_to_async

from routing.admission import Caller
from routing.attempts import Offer
from routing.backends import Call, Route
from routing.max_tokens import max_tokens_local
from routing.overload import load_admit
from routing.router import Need
from routing.services.answers import Started, event_error, events_to_end
from routing.services.prepare import Routed, completion_prompts, worst_prompt_tokens
from routing.wire import parse
from routing.wire.render import embeddings_response
from tenants.errors import ApplicationError, InvalidRequest
from workers.serving.catalog import model_tokenizer, usage_cost
from workers.serving.events import Done, Embedding, Failed
from workers.serving.jobs import Job
from workers.serving.runtime import Runtime
from workers.serving.versions import version_choose


class _Embedding(Routed):
    """An embeddings request between parsing and dispatch: the local engine's mean-pooled
    hidden states, or a remote backend with hidden states (another Fairlane, or an
    OpenAI-compatible embeddings endpoint), in the agent's chain order."""

    def __init__(self, runtime: Runtime, caller: Caller, request) -> None:
        if request.extra.get("dimensions"):
            raise InvalidRequest(
                "'dimensions' is not supported: this model's embeddings have a fixed size.",
                param="dimensions",
            )
        super().__init__(runtime, caller, request.model)
        self.request = request
        self.token_prompts: list[list[int]] = []
        if self.local is not None:
            info = self.local.info
            self.token_prompts = completion_prompts(
                info, model_tokenizer(info), request.inputs, "input"
            )
            max_tokens_local(info=info, prompts=self.token_prompts, asked=0)
        texts = [i for i in request.inputs if isinstance(i, str)]
        self.remote_tokens = sum(worst_prompt_tokens([], t) for t in texts) + sum(
            len(i) for i in request.inputs if isinstance(i, list)
        )
        self.need = Need(
            endpoint="embed",
            prompt_tokens=self.remote_tokens,
            token_prompts=len(texts) < len(request.inputs),
            tenant=str(caller.tenant.pk),
        )
        self.first_plan = self.plan()
        if self.first_plan.unsupported:
            raise InvalidRequest(
                f"No backend serving '{request.model}' returns embeddings.", param="model"
            )
        self.admitted = runtime.limiter.acquire(
            request_id=self.request_id, scopes=self.limit_scopes(), tokens=self._tokens(None)
        )
        try:
            self.first_offers = self.offers(self.first_plan)
        except BaseException:
            runtime.limiter.release(self.admitted, tokens_used=0)
            raise

    def _tokens(self, route: Route | None) -> int:
        if route is not None and route.backend.is_local or route is None and self.token_prompts:
            return sum(len(p) for p in self.token_prompts)
        return self.remote_tokens

    def offer(self, route: Route, *, has_next: bool) -> Offer:
        """The local engine: its readiness now and the job it runs; a remote backend: the call
        it is sent. Both: the worst-case cost (the prompt's tokens)."""
        refusal, call = None, None
        if route.backend.is_local:
            try:
                self.local_pool_check(route, has_next)
                load_admit(
                    pool=self.runtime.pool,
                    info=route.info,
                    lane=self.lane,
                    tenant=str(self.caller.tenant.pk),
                    max_tokens=0,
                )
            except ApplicationError as exc:
                refusal = exc
        else:
            call = Call(
                endpoint="embed",
                upstream=route.upstream,
                sampling=None,
                max_tokens=0,
                inputs=list(self.request.inputs),
            )
        caller = self.caller
        job = Job(
            request_id=self.request_id,
            task="embed",
            model=version_choose(route.info).to_dict(),
            prompts=self.token_prompts if call is None else [],
            tenant_id=caller.tenant.pk,
            agent_id=str(caller.agent.pk),
            lane=self.lane,
            weight=caller.tenant.weight,
        )
        cost = usage_cost(route.info, prompt_tokens=self._tokens(route), completion_tokens=0)
        return Offer(route=route, job=job, call=call, cost=cost, refusal=refusal)


async def embeddings_create(*, runtime: Runtime, caller: Caller, body) -> dict:
    request = parse.embedding_request_parse(body)
    embedding = await database_sync_to_async(_Embedding)(runtime, caller, request)
    served = await embedding.walk(embedding.first_offers)
    started = Started(
        runtime=runtime,
        job=served.job,
        format=None,
        events=served.events,
        stream=False,
        include_usage=False,
        admitted=embedding.admitted,
    )
    vectors: dict[int, str] = {}
    error = None
    async for event in events_to_end(started):
        match event:
            case Embedding(index=index, b64=b64):
                vectors[index] = b64
            case Failed():
                error = event_error(event)
            case Done() if error is not None:
                raise error
            case Done(usage=usage):
                return embeddings_response(
                    model=request.model,
                    vectors=vectors,
                    usage=usage,
                    encoding_format=request.encoding_format,
                )
    raise ApplicationError("The request ended without a result.")
