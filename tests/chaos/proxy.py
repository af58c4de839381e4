"""A TCP proxy of our own in front of a service (a dedicated Redis): every chunk of bytes, in
either direction, is delivered `delay` seconds late, in order. A client that dies still has its
bytes delivered after its death, as a slow network would."""

from __future__ import annotations

import asyncio
import threading

from tests.servers import free_port


class SlowProxy:
    def __init__(self, target_port: int, *, delay: float) -> None:
        self.target_port, self.delay = target_port, delay
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slow-proxy", daemon=True)
        self._thread.start()
        self._ready.wait(10)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", self.port)
        )
        self._ready.set()
        self.loop.run_forever()

    async def _serve(self, client_reader, client_writer) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                "127.0.0.1", self.target_port
            )
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(
            self._pipe(client_reader, upstream_writer),
            self._pipe(upstream_reader, client_writer),
            return_exceptions=True,
        )

    async def _pipe(self, reader, writer) -> None:
        """Copy with a delay per chunk; the order is kept, the chunks overlap in flight."""
        queue: asyncio.Queue = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                await asyncio.sleep(max(due - self.loop.time(), 0))
                if data is None:
                    break
                writer.write(data)
                await writer.drain()
            writer.close()

        sender = asyncio.ensure_future(deliver())
        try:
            while data := await reader.read(65536):
                queue.put_nowait((self.loop.time() + self.delay, data))
        finally:
            queue.put_nowait((self.loop.time() + self.delay, None))
            await asyncio.gather(sender, return_exceptions=True)

    async def _shutdown(self) -> None:
        """Close the listener and finish every pipe, so no coroutine outlives the loop (one
        collected later would run its ``finally`` on a closed loop)."""
        self.server.close()
        tasks = [t for t in asyncio.all_tasks(self.loop) if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def stop(self) -> None:
        future = asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop)
        future.result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()
