"""A job carries the engine's own SamplingParams, made once from the wire's sampling at the
edge, and they cross the fair queue (JSON in Redis) unchanged."""

import json

from routing.admission import sampling_for_engine
from routing.wire.parse import chat_request_parse
from workers.engine import SamplingParams
from workers.serving.jobs import Job

BODY = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "stop": ["a", "b"],
    "logit_bias": {"7": 5, "3": -100},
    "seed": 3,
    "logprobs": True,
    "top_logprobs": 2,
    "top_k": -1,
    "min_tokens": 50,
    "temperature": 0.5,
}


def job_with(params: SamplingParams, **fields) -> Job:
    return Job(
        request_id="r", task="generate", model={}, prompts=[[1, 2]], sampling=params, **fields
    )


def test_the_wire_sampling_becomes_the_engines_at_the_edge():
    params = sampling_for_engine(chat_request_parse(BODY).sampling, 10, {"guide": "json_object"})
    assert params == SamplingParams(
        max_tokens=10,
        temperature=0.5,
        top_k=0,
        seed=3,
        stop=("a", "b"),
        logprobs=2,
        min_tokens=10,
        logit_bias=((3, -100.0), (7, 5.0)),
        guide="json_object",
    )


def test_a_jobs_sampling_survives_the_round_trip_through_redis():
    job = job_with(sampling_for_engine(chat_request_parse(BODY).sampling, 10), n=2)
    back = Job.from_dict(json.loads(json.dumps(job.to_dict())))
    assert back == job and isinstance(back.sampling, SamplingParams)


def test_a_job_queued_before_its_task_was_named_task_still_reads():
    """During a rolling upgrade, API processes of the previous version queue `kind`."""
    job = job_with(SamplingParams(max_tokens=10))
    wire = {("kind" if key == "task" else key): value for key, value in job.to_dict().items()}
    assert Job.from_dict(json.loads(json.dumps(wire))) == job


def test_each_choice_gets_its_seed_and_a_resumed_one_what_is_left():
    job = job_with(
        SamplingParams(max_tokens=10, min_tokens=4, seed=2**63 - 1, guide="json_object"),
        n=2,
        resumed={1: [7, 8, 9]},
    )
    first, second = job.choice_params(0), job.choice_params(1)
    assert (first.seed, first.max_tokens, first.guide_prefix) == (2**63 - 1, 10, ())
    assert (second.seed, second.max_tokens, second.min_tokens) == (-(2**63), 7, 1)
    assert second.guide_prefix == (7, 8, 9)
