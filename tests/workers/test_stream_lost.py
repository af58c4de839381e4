"""A GPU worker whose Redis fails under a request's stream: the transport says so as
StreamLost, and the run ends with that error's code (a 503 the client may retry), not as an
engine bug (a 500)."""

import queue

import pytest
import redis

from tests.servers import free_port
from workers.engine import AsyncEngine, EngineConfig, ensure_preset
from workers.host import engine_policy
from workers.run_loops import run_on_thread
from workers.runs import Runs
from workers.serving.catalog import ModelInfo
from workers.serving.errors import StreamLost
from workers.serving.events import Accepted, Done, Failed, Tokens
from workers.serving.jobs import Job
from workers.serving.outbox import Outbox
from workers.transport import RedisStreamEmit


def test_an_unreachable_stream_store_is_a_lost_stream():
    client = redis.Redis(port=free_port(), socket_connect_timeout=1)
    with pytest.raises(StreamLost):
        RedisStreamEmit(client, "r1", owner="w1")(Accepted())
    with pytest.raises(StreamLost):
        RedisStreamEmit(client, "r1")(Accepted())


@pytest.mark.django_db(transaction=True)
def test_a_run_whose_stream_is_lost_fails_with_a_retryable_503_code(tmp_path):
    engine = AsyncEngine.from_config(
        EngineConfig(model=str(ensure_preset("tiny", tmp_path)), max_num_seqs=1),
        policy=engine_policy(),
    ).start()
    sent, quiet = [], queue.Queue()

    def emit(event):
        if any(isinstance(e, Tokens) for e in sent):  # Redis went away after the first token
            quiet.put(event)
            if isinstance(event, Failed | Done):
                return  # Redis is back for the last events
            raise StreamLost(retry_after=2)
        sent.append(event)

    job = Job(
        request_id="lost-1",
        task="generate",
        model=ModelInfo(name="tiny", source="preset:tiny").to_dict(),
        prompts=[[5, 6, 7]],
        sampling={"max_tokens": 50, "temperature": 0, "ignore_eos": True},
        tenant_id=1,
    )
    try:
        run_on_thread(job, engine, emit, backend="test", outbox=Outbox(root=tmp_path), runs=Runs())
    finally:
        engine.shutdown()
    after = list(quiet.queue)
    failed = [e for e in after if isinstance(e, Failed)]
    assert len(failed) == 1, after
    assert failed[0].code == "backend_unavailable" and failed[0].retry_after == 2
    assert isinstance(after[-1], Done)  # and it was settled
