"""The embedded mode's engine orders waiting sequences by the fair queue's rule: a request
tells the engine's policy its lane, tenant and the tenant's weight."""

import queue

from workers.engine import AsyncEngine, EngineConfig, ensure_preset
from workers.host import engine_policy
from workers.runs import EngineRun, Runs
from workers.serving.catalog import ModelInfo
from workers.serving.jobs import Job
from workers.serving.outbox import Outbox


def test_a_run_hands_the_engine_its_tenant_lane_and_weight(tmp_path):
    engine = AsyncEngine.from_config(
        EngineConfig(model=str(ensure_preset("tiny", tmp_path)), max_num_seqs=1),
        policy=engine_policy(),
    ).start()
    inbox = queue.Queue()
    try:
        jobs = [
            Job(
                request_id=f"r{i}",
                task="generate",
                model=ModelInfo(name="tiny", source="preset:tiny").to_dict(),
                prompts=[[5, 6, 7]],
                sampling={"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True},
                tenant_id=tenant,
                lane=lane,
                weight=weight,
            )
            # The first runs long enough that the other two are both waiting behind it.
            for i, (tenant, lane, weight, max_tokens) in enumerate(
                [(1, "bulk", 1, 300), (1, "bulk", 1, 4), (2, "realtime", 3, 4)]
            )
        ]
        for job in jobs:
            EngineRun(
                job, engine, backend="test", outbox=Outbox(root=tmp_path), runs=Runs()
            ).submit(lambda index, rid=job.request_id: lambda item: inbox.put((rid, item)))
        assert engine.engine.policy.tenant_weights == {"1": 1.0, "2": 3.0}
        finished = []
        while len(finished) < 3:
            rid, item = inbox.get(timeout=30)
            if item.finished:
                finished.append(rid)
        # One sequence at a time: the realtime request, submitted last, overtakes the second
        # bulk one that was still waiting.
        assert finished.index("r2") < finished.index("r1")
    finally:
        engine.shutdown()
