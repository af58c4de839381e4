"""What requests are turned into before dispatch: who pays, which routes serve the model and
what each would be sent and cost (`Routed`, shared by generation and embeddings, and its walk
over those offers), prompts as token ids (our tokenizers), texts for remote backends with
their worst-case token counts, and whether the local pool can take a model now."""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from dataclasses import replace

from django.conf import settings

from routing.admission import Caller
from routing.attempts import Attempt, Offer, Offers
from routing.backends import Route
from routing.dispatch import Served, offer_try, round_wait, walk_abandon, walk_error
from routing.ratelimit import Admitted, LimitScope, scopes_for
from routing.router import Need, Plan, registry_get, route_plan
from routing.sync import db_call
from routing.wire.messages import message_images, message_text
from routing.wire.tools import ToolUse
from tenants.errors import ApplicationError, BackendUnavailable, InvalidRequest, ModelNotFound
from tenants.models import Lane
from tenants.services.budget_soft import budget_soft_check
from tenants.services.tenancy import tenant_cache_salt  # noqa: F401  (routing's name for it)
from workers.serving.catalog import ModelInfo, model_vocab_size
from workers.serving.runtime import Runtime
from workers.serving.trace import trace_current


class Routed:
    """A request between parsing and dispatch. Subclasses set `need` and make each route's
    offer (`offer`): its job or call, worst-case cost, and the local engine's readiness."""

    need: Need

    def __init__(self, runtime: Runtime, caller: Caller, model: str) -> None:
        self.runtime, self.caller, self.model = runtime, caller, model
        self.request_id = caller.request_id or uuid.uuid4().hex
        current = trace_current()
        if current is not None:  # its logs name it from now on
            current.request_id = self.request_id
        self.lane = (
            Lane.BULK if caller.batch_id else caller.agent.lane or caller.tenant.default_lane
        )
        # Soft budget levels crossed: demoted to the bulk lane (same price), or throttled.
        self.soft = budget_soft_check(
            tenant=caller.tenant, agent=caller.agent, api_key=caller.api_key, model=model
        )
        if self.soft.demoted:
            self.lane = Lane.BULK
        routes = registry_get().routes.get(model)
        if not routes or not caller.agent.may_use_model(model):
            raise ModelNotFound(
                f"The model '{model}' does not exist or you do not have access to it.",
                param="model",
            )
        self.routes = routes
        self.local = next((r for r in routes if r.backend.is_local), None)
        self.attempt = Attempt(
            runtime=runtime,
            request_id=self.request_id,
            tenant=caller.tenant,
            agent=caller.agent,
            api_key=caller.api_key,
            model=model,
        )
        self.admitted: Admitted | None = None  # its rate-limit slot, once taken

    def limit_scopes(self) -> tuple[LimitScope, ...]:
        """The caller's rate limits, and the requests-per-minute of each budget whose soft
        level throttles it now."""
        slot = f"tenant:{self.caller.tenant.pk}"
        soft = tuple(
            LimitScope(f"soft_budget:{budget_id}", rpm, 0, 0, slot=slot)
            for budget_id, rpm in self.soft.throttles
        )
        return scopes_for(self.caller) + soft

    def plan(self) -> Plan:
        return route_plan(
            registry=registry_get(),
            agent_id=str(self.caller.agent.pk),
            model=self.model,
            need=self.need,
        )

    def local_pool_check(self, route: Route, has_next: bool) -> None:
        """Skip the local pool at once when the model failed to load wherever it is hosted
        (workers advertise it in their heartbeats; the embedded engine knows it), and, with
        another backend to go to, when no GPU worker hosts it (otherwise the request waits in
        the queue for one)."""
        retry_in = self.runtime.pool.model_load_failed(route.model)
        if retry_in is not None:
            raise BackendUnavailable(
                "The model could not be loaded; retry later.",
                retry_after=max(math.ceil(retry_in), 1),
            )
        if has_next and not self.runtime.pool.model_hosted(route.model):
            raise BackendUnavailable(f"No GPU worker hosts '{route.model}' now.")

    def offer(self, route: Route, *, has_next: bool) -> Offer:
        raise NotImplementedError

    def offers(self, plan: Plan | None = None) -> Offers:
        """Each route of the plan (a fresh one unless given) as what it would be sent and
        cost, in the plan's order (synchronous: the local engine's load is read)."""
        plan = plan or self.plan()
        routes = [batch_priced(r) for r in plan.routes] if self.caller.batch_id else plan.routes
        return Offers(
            [self.offer(route, has_next=i + 1 < len(routes)) for i, route in enumerate(routes)],
            plan.blocked_for,
        )

    async def walk(self, offers: Offers | None = None) -> Served:
        """Serve the request on the first offer that can (`offers`, or a fresh round's);
        raises the error the client should see when none could, its hold and rate-limit
        slot given back. Later rounds are offered again: circuits, queues and waits have
        changed."""
        attempt = self.attempt
        deadline = time.monotonic() + settings.FAIRLANE_RETRY_MAX_WAIT_SECONDS
        rounds = 0
        try:
            while True:
                if offers is None:
                    offers = await db_call(self.offers)()
                for offer in offers.offers:
                    served = await offer_try(attempt, offer)
                    if served is not None:
                        return served
                rounds += 1
                await asyncio.sleep(round_wait(attempt, offers, rounds, deadline))
                offers = None
        except ApplicationError as exc:
            await self._abandon()
            raise walk_error(attempt, exc) from None
        except BaseException:
            await self._abandon()
            raise

    async def _abandon(self) -> None:
        """The walk ends unserved: its rate-limit slot and its reservation are given back."""
        if self.admitted is not None:
            self.runtime.limiter.release(self.admitted, tokens_used=0)
        await walk_abandon(self.attempt)


def batch_priced(route: Route) -> Route:
    """The route at the batch price: its model's prices less the model's batch discount
    (FAIRLANE_BATCH_DISCOUNTS, else FAIRLANE_BATCH_DISCOUNT_PERCENT)."""
    info = route.info
    percent = settings.FAIRLANE_BATCH_DISCOUNTS.get(
        info.name, settings.FAIRLANE_BATCH_DISCOUNT_PERCENT
    )
    keep = max(0, min(100, 100 - percent))
    return replace(
        route,
        info=replace(
            info,
            price_input_per_mtok=info.price_input_per_mtok * keep // 100,
            price_output_per_mtok=info.price_output_per_mtok * keep // 100,
            price_cached_per_mtok=info.price_cached_per_mtok * keep // 100,
        ),
    )


def chat_prompt(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    if not tokenizer.chat_template:
        raise InvalidRequest("This model has no chat template; use /v1/completions.", param="model")
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=tools)
    except Exception as exc:  # a template that refuses these messages (e.g. role order)
        raise InvalidRequest(
            f"The model's chat template rejected the messages: {exc}", param="messages"
        ) from None
    return tokenizer.encode(text, add_special_tokens=False)


def completion_prompts(info: ModelInfo, tokenizer, prompts: list, param: str) -> list[list[int]]:
    vocab = model_vocab_size(info)
    for prompt in prompts:
        if isinstance(prompt, list) and max(prompt) >= vocab:
            raise InvalidRequest(
                f"Token id {max(prompt)} is outside this model's vocabulary (size {vocab}).",
                param=param,
            )
    return [p if isinstance(p, list) else tokenizer.encode(p) for p in prompts]


def prompt_texts(endpoint: str, request) -> tuple[list[dict], str | list]:
    """What a remote backend is sent: the messages, or the prompt as given (token ids and
    batches only reach backends sharing our tokenizers; see router.route_supports)."""
    if endpoint == "chat":
        return request.messages, ""
    prompts = request.prompts
    return [], prompts[0] if len(prompts) == 1 else prompts


def worst_prompt_tokens(
    messages: list[dict], prompt: str | list, tool_use: ToolUse | None = None
) -> int:
    """No tokenizer at hand (a remote-only model): every token is at least one byte, plus the
    chat format's few tokens per message; token ids count as themselves. Tool definitions
    and schemas count as their JSON's bytes, each image as FAIRLANE_IMAGE_WORST_TOKENS."""
    prompts = (
        prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int)
        else [prompt]
    )
    tokens = sum(len(p) if isinstance(p, list) else len(p.encode()) for p in prompts)
    return (
        tokens
        + len("".join(message_text(m) for m in messages).encode())
        + 8 * (len(messages) + 1)
        + tool_use_tokens(tool_use)
        + settings.FAIRLANE_IMAGE_WORST_TOKENS * sum(len(message_images(m)) for m in messages)
    )


def tool_use_tokens(tool_use: ToolUse | None) -> int:
    """Tool definitions and a response schema: their JSON's bytes (a byte a token at worst)."""
    if tool_use is None or not (tool_use.tools or tool_use.response_format):
        return 0
    return len(json.dumps([tool_use.tools, tool_use.response_format]).encode())
