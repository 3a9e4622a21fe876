"""uvicorn (httptools on uvloop) with the replica's transport contract: every answer is JSON.

uvicorn answers what the HTTP parser refuses with a plain-text 400 and closes; an HTTP/1.0 client
asking for keep-alive gets its connection closed; a client that half-closes after a short body gets
no answer at all; a stop resets connections still in the kernel's accept queue. What we change,
each in a few lines over uvicorn's own protocol and server:

- a method the parser does not know (``BREW``): ``405`` with ``Allow``; a bad version word
  (``HTTP/9.9``): ``505``; anything else the parser refuses: ``400``; all as ``{"error": ...}``;
- HTTP/1.0 with ``Connection: keep-alive`` (``ab -k``): the connection stays open (the app says
  ``Connection: keep-alive`` in the answer, :class:`serving_bridge.app.ScoringApp`);
- a client that shuts its sending side (``SHUT_WR``) mid-body: the body ends there and the app
  answers ``400`` on the still-open write side, instead of the transport closing unanswered;
- the stop (SIGTERM): :class:`DrainingServer` keeps a duplicate of the listening socket, so after
  uvicorn stops accepting, the connections the kernel completed meanwhile are taken from it and
  answered (for at most ``drain_s``) before the listener closes; in-flight requests finish (uvicorn);
- :meth:`DrainingServer.on_tick` (every 0.1 s) feeds the systemd watchdog and reports swaps;
- with ``balance`` (a worker of several sharing the port) the server accepts connections itself,
  one at a time, and leaves a connection to a sibling worker that holds fewer
  (:mod:`serving_bridge.worker_slot`), for at most :data:`MAX_DEFER_S`; uvloop's own accept takes
  every connection waiting in one go.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["MAX_DEFER_S", "DrainingServer", "JsonErrorsProtocol", "error_bytes"]

log = logging.getLogger(__name__)
MAX_DEFER_S = 0.05  # the longest a connection is left to a sibling worker before this one takes it
_DEFER_STEP_S = 0.001
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def error_bytes(status: int, reason: str, message: str, *headers: tuple[str, str]) -> bytes:
    """A whole HTTP/1.1 answer ``{"error": message}`` that closes the connection."""
    body = json.dumps({"error": message}).encode()
    head = [f"HTTP/1.1 {status} {reason}", "content-type: application/json"]
    head += [f"{k}: {v}" for k, v in headers]
    head += [f"content-length: {len(body)}", "connection: close", "", ""]
    return "\r\n".join(head).encode("latin-1") + body


class JsonErrorsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol; parser errors, HTTP/1.0 keep-alive and half-close as above."""

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserInvalidMethodError:
            words = data.split(b"\r\n", 1)[0].split(b" ")
            method = words[0].decode("latin-1")[:32]
            path = words[1].decode("latin-1").split("?", 1)[0][:200] if len(words) > 1 else "/"
            allowed = "POST" if path == "/score" else "GET"
            message = f"method {method} not allowed on {path}; allowed: {allowed}"
            self._refuse(405, "Method Not Allowed", message, ("allow", allowed))
        except httptools.HttpParserError as exc:
            if "version" in str(exc).lower():
                self._refuse(505, "HTTP Version Not Supported", "HTTP/1.1 or HTTP/1.0 only")
            else:
                self._refuse(400, "Bad Request", f"not a valid HTTP request: {exc}")
        except httptools.HttpParserUpgrade:  # CONNECT or an Upgrade: the app has answered (405)
            pass

    def _refuse(self, status: int, reason: str, message: str, *headers: tuple[str, str]) -> None:
        log.debug("serve: refused a request the HTTP parser cannot read: %s", message)
        if not self.transport.is_closing():
            self.transport.write(error_bytes(status, reason, message, *headers))
            self.transport.close()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        # uvicorn never keeps an HTTP/1.0 connection; the parser knows whether the client asked to
        if self.cycle is not None and self.scope.get("http_version") == "1.0":
            self.cycle.keep_alive = self.parser.should_keep_alive()

    def eof_received(self) -> bool:  # type: ignore[override]
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and cycle.more_body:
            cycle.more_body = False  # the body ends here; the app sees fewer bytes than announced
            cycle.keep_alive = False
            cycle.message_event.set()
            return True  # keep the write side open for the answer
        return False


class DrainingServer(uvicorn.Server):
    """uvicorn's server; answers the accept queue on stop, and calls ``tick`` every 0.1 s."""

    def __init__(
        self,
        config: uvicorn.Config,
        listener: socket.socket,
        *,
        tick: Callable[[], None] | None = None,
        on_exit_signal: Callable[[], None] | None = None,
        drain_s: float = 1.0,
        balance: Any = None,
    ) -> None:
        super().__init__(config)
        self._spare = listener.dup()  # keeps the kernel's queue alive after uvicorn closes its copy
        self._tick, self._on_exit_signal, self.drain_s = tick, on_exit_signal, drain_s
        self.backlog_answered = 0
        self.accepting = True
        # a WorkerSlot (defer_accept, set_connections): accept here, balanced with the siblings
        self._balance = balance
        self._listener = listener
        self._reading = False
        self._deferred_since: float | None = None
        self._connecting: set[asyncio.Task[Any]] = set()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if self._balance is None or not sockets:
            await super().startup(sockets)
            return
        await super().startup([])  # uvicorn's state and lifespan; the accepting is done here
        self._listener.setblocking(False)
        self._watch(True)

    def _watch(self, on: bool) -> None:
        """Start or stop watching the listening socket for a connection to accept."""
        loop = asyncio.get_running_loop()
        if on and not self._reading and self.accepting:
            loop.add_reader(self._listener.fileno(), self._accept_one)
            self._reading = True
        elif not on and self._reading:
            loop.remove_reader(self._listener.fileno())
            self._reading = False

    def _accept_one(self) -> None:
        """A connection waits: take it, unless a live sibling holds fewer connections and it has
        not waited :data:`MAX_DEFER_S` yet (then look again in a millisecond)."""
        loop = asyncio.get_running_loop()
        mine = len(self.server_state.connections)
        now = time.monotonic()
        if self._balance.defer_accept(mine):
            if self._deferred_since is None:
                self._deferred_since = now
            if now - self._deferred_since < MAX_DEFER_S:
                self._watch(False)
                loop.call_later(_DEFER_STEP_S, self._watch, True)
                return
        self._deferred_since = None
        try:
            conn, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):  # a sibling took it
            return
        except OSError as exc:
            if exc.errno in _OUT_OF_RESOURCES:  # out of descriptors: look again in a while
                log.warning("serve: cannot accept a connection (%s); trying again in 0.1 s", exc)
                self._watch(False)
                loop.call_later(0.1, self._watch, True)
            return  # else the client gave up meanwhile
        conn.setblocking(False)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._balance.set_connections(mine + 1)
        task = loop.create_task(loop.connect_accepted_socket(self._protocol, conn))
        self._connecting.add(task)  # referenced until done (the loop keeps weak references only)
        task.add_done_callback(self._connected)

    def _connected(self, task: asyncio.Task[Any]) -> None:
        self._connecting.discard(task)
        if not task.cancelled() and task.exception() is not None:  # the client left meanwhile
            log.debug("serve: an accepted connection could not start: %r", task.exception())

    def _protocol(self) -> JsonErrorsProtocol:
        return JsonErrorsProtocol(
            config=self.config, server_state=self.server_state, app_state=self.lifespan.state
        )

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self._on_exit_signal is not None and not self.should_exit:
            self._on_exit_signal()
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if self._tick is not None:
            self._tick()
        return await super().on_tick(counter)

    async def stop_accepting(self) -> None:
        """Close uvicorn's listeners; completed connections wait in the kernel's queue (the spare)."""
        if self.accepting:
            if self._balance is not None:
                self._watch(False)
            self.accepting = False
            for server in self.servers:
                server.close()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self.stop_accepting()
        await self._answer_backlog()
        await super().shutdown(sockets)
        # uvicorn re-raises the stop signal once its handlers are restored (the process then dies
        # of SIGTERM, rc -15); a drained replica exits 0, as systemd and the fleet tests expect
        self._captured_signals.clear()

    async def _answer_backlog(self) -> None:
        """Hand every connection already in the accept queue to a protocol and wait (at most
        ``drain_s``) until each has its request read, so uvicorn's shutdown lets it finish."""
        loop, spare = asyncio.get_running_loop(), self._spare
        spare.setblocking(False)
        protocols: list[JsonErrorsProtocol] = []
        deadline = time.monotonic() + self.drain_s
        try:
            while time.monotonic() < deadline:
                try:
                    conn, _ = spare.accept()
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:  # the client gave up meanwhile
                    continue

                _, protocol = await loop.connect_accepted_socket(self._protocol, conn)
                protocols.append(protocol)
                self.backlog_answered += 1
            while time.monotonic() < deadline and any(
                p.cycle is None and not p.transport.is_closing() for p in protocols
            ):
                await asyncio.sleep(0.005)
        finally:
            spare.close()
