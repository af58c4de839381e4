"""The shared upstream client (routing/backends): a real HTTP server on 127.0.0.1 that sets a
cookie; the next call, as another tenant's could be, must not carry it back."""

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from routing.backends import http_client


class _SetsCookie(BaseHTTPRequestHandler):
    seen: list = []

    def do_GET(self):
        self.seen.append(self.headers.get("Cookie"))
        self.send_response(200)
        self.send_header("Set-Cookie", "session=tenant-a; Path=/")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


def test_a_cookie_an_upstream_sets_is_not_sent_on_the_next_call():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SetsCookie)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"

    async def twice():
        client = http_client()
        first = await client.get(url)
        second = await client.get(url)
        return first, second

    try:
        first, second = asyncio.run(twice())
    finally:
        server.shutdown()
    assert first.headers["set-cookie"].startswith("session=tenant-a")
    assert second.status_code == 200
    assert _SetsCookie.seen == [None, None]
