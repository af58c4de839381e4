"""Failures that used to be swallowed are logged and answered truthfully: a websocket send to a
client that is gone, and a backend registry the metrics scrape cannot read."""

import asyncio
import logging

import pytest
from django.db import OperationalError, connection
from prometheus_client import REGISTRY

from routing.backend_store import backend_register
from routing.consumers import CompletionConsumer


def test_a_failed_websocket_send_is_logged_and_stops_the_sockets_requests(caplog):
    async def scenario():
        consumer = CompletionConsumer()

        async def gone(message):  # the ASGI server's send once the client vanished
            raise OSError("connection reset by peer")

        consumer.base_send = gone
        consumer.runs = {"a1": asyncio.create_task(asyncio.sleep(60))}
        with caplog.at_level(logging.WARNING, logger="routing.consumers"):
            await consumer._send({"type": "chunk", "id": "a1", "data": {}})
            await consumer._send({"type": "chunk", "id": "a1", "data": {}})  # not logged again
        await asyncio.sleep(0)
        return consumer.runs["a1"].cancelled()  # before asyncio.run cancels what is left

    assert asyncio.run(scenario())
    failures = [r for r in caplog.records if "websocket send failed" in r.getMessage()]
    assert len(failures) == 1 and "connection reset by peer" in failures[0].getMessage()
    assert "a1" in failures[0].getMessage()


@pytest.mark.django_db
def test_a_scrape_that_cannot_read_the_registry_says_so_and_logs_it(caplog):
    backend_register(name="remote-a", kind="openai", base_url="http://127.0.0.1:9")
    assert REGISTRY.get_sample_value("fairlane_backend_registry_readable") == 1.0
    assert REGISTRY.get_sample_value("fairlane_backend_up", {"backend": "remote-a"}) == 0.0

    def database_down(execute, sql, params, many, context):
        raise OperationalError("server closed the connection unexpectedly")

    with (
        caplog.at_level(logging.ERROR, logger="routing.metrics"),
        connection.execute_wrapper(database_down),
    ):
        assert REGISTRY.get_sample_value("fairlane_backend_registry_readable") == 0.0
        assert REGISTRY.get_sample_value("fairlane_backend_up", {"backend": "remote-a"}) is None
    assert any(
        "registry could not be read" in r.getMessage() and r.exc_info for r in caplog.records
    )
