"""A client that does not stream is answered from a call that does not stream when the whole
answer fits the backend's timeout (routing.backends.base.call_streams): one body upstream, read
as the same events, metered from the provider's usage; whole or not at all."""

import asyncio
import json

import pytest
from channels.db import database_sync_to_async

from routing.backend_store import agent_routing_set
from routing.backends.base import body_json
from routing.bench.fakes import cut, slow_first_byte
from tenants.models import Reservation, UsageRecord
from tests.routing.test_routing import PRICES, chat, register, rows, streamed

pytestmark = pytest.mark.django_db(transaction=True)


async def test_a_short_answer_for_a_client_that_does_not_stream_is_one_body(key, agent, fakes):
    fake = fakes("openai", reply_tokens=10)
    await database_sync_to_async(register)("whole", fake, prices=PRICES, timeout_seconds=2.0)
    response = await chat(key, max_tokens=5)  # 5 <= 2 s x 10 tokens/s
    assert response.status_code == 200, response.content
    sent = fake.requests[-1]
    assert sent["stream"] is False and "stream_options" not in sent
    answer = json.loads(response.content)
    assert answer["choices"][0]["message"]["content"] == "t0 t1 t2 t3 t4 "
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 5
    [row] = await database_sync_to_async(rows)()
    assert (
        (row.prompt_tokens, row.completion_tokens)
        == (fake.stats["prompt_tokens"], fake.stats["completion_tokens"])
        == (3, 5)
    )
    assert row.status == UsageRecord.Status.OK and row.cost_microcents == 3 * 100 + 5 * 300

    # Longer than a 10 tokens/s backend writes in its 2 s timeout: streamed upstream, so the
    # timeout keeps bounding the wait between tokens, not for the whole answer.
    response = await chat(key, max_tokens=25)
    assert fake.requests[-1]["stream"] is True
    assert fake.requests[-1]["stream_options"] == {"include_usage": True}
    assert json.loads(response.content)["choices"][0]["message"]["content"] == "".join(
        f"t{i} " for i in range(10)
    )
    # A client that streams is always streamed to.
    payloads = await streamed(await chat(key, stream=True, max_tokens=5))
    assert fake.requests[-1]["stream"] is True and payloads[-1] == "[DONE]"


async def test_every_call_streams_when_the_setting_is_zero(key, agent, fakes, settings):
    settings.FAIRLANE_WHOLE_ANSWER_TOKENS_PER_SECOND = 0
    fake = fakes("openai")
    await database_sync_to_async(register)("streams", fake)
    response = await chat(key, max_tokens=3)
    assert response.status_code == 200 and fake.requests[-1]["stream"] is True


async def test_logprobs_come_through_a_whole_answer(key, agent, fakes):
    fake = fakes("openai", reply_tokens=4)
    await database_sync_to_async(register)("whole", fake)
    response = await chat(key, max_tokens=4, logprobs=True, top_logprobs=2)
    assert fake.requests[-1]["stream"] is False and fake.requests[-1]["top_logprobs"] == 2
    choice = json.loads(response.content)["choices"][0]
    assert [e["token"] for e in choice["logprobs"]["content"]] == ["t0 ", "t1 ", "t2 ", "t3 "]
    assert {e["logprob"] for e in choice["logprobs"]["content"]} == {fake.logprob}


async def test_a_whole_answer_cut_before_its_end_falls_through_and_is_charged_once(
    key, agent, fakes
):
    """The connection drops inside the body (a stream would have sent 3 tokens): nothing
    reached the client, so the next backend answers, and only its answer is charged."""
    first, second = fakes("openai"), fakes("openai")
    first.push(cut(after=3))
    await database_sync_to_async(register)("first", first, prices=PRICES)
    await database_sync_to_async(register)("second", second, prices=PRICES)
    await database_sync_to_async(agent_routing_set)(agent=agent, chain=["first", "second"])
    response = await chat(key)
    assert response.status_code == 200, response.content
    assert response["x-fairlane-backend"] == "second"
    assert first.stats["requests"] == 1 and first.requests[-1]["stream"] is False
    [row] = await database_sync_to_async(rows)()
    assert row.backend == "second" and row.completion_tokens == second.stats["completion_tokens"]


async def test_a_client_leaving_before_the_whole_answer_is_charged_nothing(key, agent, fakes):
    fake = fakes("openai")
    fake.push(slow_first_byte(1.0))
    await database_sync_to_async(register)("slow", fake, prices=PRICES)
    task = asyncio.ensure_future(chat(key))
    for _ in range(100):
        if fake.stats["requests"]:
            break
        await asyncio.sleep(0.02)
    assert fake.requests[-1]["stream"] is False
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    def reservations():
        return list(Reservation.objects.values_list("status", flat=True))

    for _ in range(100):
        found = await database_sync_to_async(reservations)()
        if found and Reservation.Status.HELD not in found:
            break
        await asyncio.sleep(0.05)
    assert found == [Reservation.Status.RELEASED]
    assert await database_sync_to_async(rows)() == []


def test_a_body_orjson_refuses_is_written_by_the_stdlib():
    body = {"messages": [{"role": "user", "content": "a \ud800 b"}]}  # a lone surrogate
    assert json.loads(body_json(body)) == body
    assert body_json({"a": "é"}) == '{"a":"é"}'.encode()
