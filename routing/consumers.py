"""Websocket consumers of the public API (the serving issue adds /ws/v1/chat here)."""

websocket_urlpatterns: list = []
