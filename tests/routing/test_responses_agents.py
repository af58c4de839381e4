"""The OpenAI Agents SDK (`openai-agents`), unmodified, runs a two-tool agent against the local
`tiny` model through /v1/responses until it answers: its first turn must call a tool
(tool_choice required, a guided call even with random weights), the SDK runs the tool and
asks again (tool_choice back to auto), and the model answers. Each model call is one ledger
row charged to the agent."""

import pytest
from agents import (
    Agent,
    AgentOutputSchema,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from channels.db import database_sync_to_async
from openai import AsyncOpenAI
from pydantic import BaseModel

from tenants.models import UsageRecord

pytestmark = pytest.mark.django_db(transaction=True)
CALLED: list[str] = []


class Report(BaseModel):
    """The agent's answer: a structured output (text.format json_schema), so that the
    random model's answer is guided to end, as a real model's would."""

    done: bool


@function_tool
def set_flag(on: bool) -> str:
    """Turn the flag on or off."""
    CALLED.append(f"set_flag({on})")
    return "done"


@function_tool
def set_level(high: bool) -> str:
    """Set the level high or low."""
    CALLED.append(f"set_level({high})")
    return "ok"


def test_an_agents_sdk_agent_calls_a_tool_then_answers(embedded_server, key, agent, budget):
    set_tracing_disabled(True)  # nothing is sent to OpenAI's trace collector
    client = AsyncOpenAI(api_key=key, base_url=embedded_server.url + "/v1", max_retries=0)
    helper = Agent(
        name="helper",
        instructions="Use the tools, then say what you did.",
        tools=[set_flag, set_level],
        output_type=AgentOutputSchema(Report),
        model=OpenAIResponsesModel(model="tiny", openai_client=client),
        model_settings=ModelSettings(
            tool_choice="required", parallel_tool_calls=False, max_tokens=200, temperature=0
        ),
    )
    CALLED.clear()
    result = Runner.run_sync(helper, "Turn the flag on.", max_turns=6)
    assert CALLED and all(c.startswith(("set_flag(", "set_level(")) for c in CALLED)
    assert isinstance(result.final_output, Report)
    calls = result.raw_responses
    assert len(calls) == len(CALLED) + 1  # a model call per tool call, then the answer
    rows = UsageRecord.objects.filter(agent=agent).order_by("created_at")
    assert [r.request_id for r in rows] == [c.response_id.removeprefix("resp_") for c in calls]
    assert [(r.prompt_tokens, r.completion_tokens) for r in rows] == [
        (c.usage.input_tokens, c.usage.output_tokens) for c in calls
    ]


async def test_the_agent_streamed_runs_the_same_loop(embedded_server, key, agent, budget):
    """Runner.run_streamed: the SDK parses our semantic events as it streams them."""
    set_tracing_disabled(True)
    client = AsyncOpenAI(api_key=key, base_url=embedded_server.url + "/v1", max_retries=0)
    helper = Agent(
        name="helper",
        instructions="Use the tools, then say what you did.",
        tools=[set_flag, set_level],
        output_type=AgentOutputSchema(Report),
        model=OpenAIResponsesModel(model="tiny", openai_client=client),
        model_settings=ModelSettings(
            tool_choice="required", parallel_tool_calls=False, max_tokens=200, temperature=0
        ),
    )
    CALLED.clear()
    run = Runner.run_streamed(helper, "Turn the flag on.", max_turns=6)
    kinds = [event.type async for event in run.stream_events()]
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
    assert CALLED and isinstance(run.final_output, Report)
    assert len(run.raw_responses) == len(CALLED) + 1
    rows = database_sync_to_async(UsageRecord.objects.filter(agent=agent).count)
    assert await rows() == len(run.raw_responses)
