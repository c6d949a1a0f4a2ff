"""A small TCP fault proxy between workers and PostgreSQL.

No maintained library fits: Toxiproxy's server is a Go binary that neither PyPI nor
Debian ships here, and the pure-Python chaos proxies on PyPI (``faulty``) only rewrite
or drop bytes of a stream; none holds established connections (a blackhole) or resets
them. This one runs its own event loop in a thread, so a test's blocking calls never
stall the traffic, and has three modes:

- ``pass``: forward, optionally after ``latency`` seconds per chunk;
- ``blackhole``: accept and keep connections, but forward nothing until healed (what a
  dropped route looks like to TCP: the peers' bytes are delivered late, on healing);
- ``reset``: reset (RST) every open connection now, and every new one on arrival.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass
class ProxyStats:
    accepted: int = 0
    resets: int = 0
    bytes_up: int = 0
    bytes_down: int = 0


def _rst(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset rather than a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    """Listens on ``listen_host`` (127.0.0.1 unless told; a free port) and forwards to
    ``target``."""

    def __init__(self, target_host: str, target_port: int, listen_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.listen_host = listen_host
        self.port = 0
        self.mode = "pass"
        self.latency = 0.0
        self.stats = ProxyStats()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._healed: asyncio.Event | None = None
        self._conns: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    # -- control (from any thread) -------------------------------------------------------

    def start(self) -> int:
        self._thread.start()
        self._call(self._start())
        return self.port

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def set_latency(self, seconds: float) -> None:
        self._call(self._set("pass", seconds))

    def blackhole(self) -> None:
        self._call(self._set("blackhole", self.latency))

    def reset(self) -> None:
        """Reset every connection now and refuse (reset) new ones until :meth:`heal`."""
        self._call(self._set("reset", self.latency))

    def reset_once(self) -> int:
        """Reset every open connection once; new ones pass."""
        return self._call(self._reset_all())

    def heal(self) -> None:
        self._call(self._set("pass", 0.0))

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    # -- inside the proxy's loop ---------------------------------------------------------

    async def _start(self) -> None:
        self._healed = asyncio.Event()
        self._healed.set()
        self._server = await asyncio.start_server(self._accept, self.listen_host, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._reset_all()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _set(self, mode: str, latency: float) -> None:
        assert self._healed is not None
        self.mode, self.latency = mode, latency
        if mode == "blackhole":
            self._healed.clear()
        else:
            self._healed.set()
        if mode == "reset":
            await self._reset_all()

    async def _reset_all(self) -> int:
        conns = list(self._conns)
        for client, upstream in conns:
            _rst(client)
            _rst(upstream)
        self._conns.clear()
        self.stats.resets += len(conns)
        return len(conns)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._healed is not None
        self.stats.accepted += 1
        if self.mode == "reset":
            self.stats.resets += 1
            _rst(writer)
            return
        # A blackholed connection attempt hangs until the partition heals.
        await self._healed.wait()
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            _rst(writer)
            return
        pair = (writer, up_writer)
        self._conns.add(pair)
        tasks = [
            asyncio.create_task(self._pipe(reader, up_writer, up=True)),
            asyncio.create_task(self._pipe(up_reader, writer, up=False)),
        ]
        for task in tasks:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        self._conns.discard(pair)
        for w in pair:
            with contextlib.suppress(Exception):
                w.close()

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, up: bool
    ) -> None:
        assert self._healed is not None
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                chunk = await reader.read(65536)
                if not chunk:
                    return
                await self._healed.wait()
                if self.latency > 0:
                    await asyncio.sleep(self.latency)
                writer.write(chunk)
                await writer.drain()
                if up:
                    self.stats.bytes_up += len(chunk)
                else:
                    self.stats.bytes_down += len(chunk)
