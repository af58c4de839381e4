"""The /v1 request path shared by HTTP (JSON and SSE) and websockets: parse, admit, route and
dispatch, and turn the run's events into OpenAI objects."""

from routing.services.answers import Started, started_chunks, started_collect
from routing.services.catalog import models_available
from routing.services.embeddings import embeddings_create
from routing.services.generation import generation_start, request_start

__all__ = [
    "Started",
    "embeddings_create",
    "request_start",
    "generation_start",
    "models_available",
    "started_chunks",
    "started_collect",
]
