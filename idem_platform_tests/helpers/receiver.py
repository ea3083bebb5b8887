"""A real HTTP receiver on loopback for the effects tests: it records every request's
``Idempotency-Key``, answers as a script says (200, 500, 429 with Retry-After, 400, slow),
and *acts* once per key (a receiver that dedupes by key, as the design expects)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Reply:
    """One scripted answer: a status, extra headers, and a delay before answering."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    body: str = '{"ok":true}'


Script = Callable[[str, int], Reply]  # (key, how many times this key came before) -> the answer


@dataclass
class Receiver:
    """What the receiver saw: every request (key, body, headers) and the keys it acted on."""

    script: Script
    url: str = ""
    requests: list[tuple[str, Any, dict[str, str]]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # time.monotonic() of each request, in order
    acted: dict[str, int] = field(default_factory=dict)  # key -> times acted (must stay 1)
    in_flight: dict[str, int] = field(default_factory=dict)
    overlaps: list[str] = field(default_factory=list)  # keys received while the same key was in flight
    peers: list[int] = field(default_factory=list)  # the client port of each request: its connection
    lock: threading.Lock = field(default_factory=threading.Lock)

    def keys(self) -> list[str]:
        with self.lock:
            return [key for key, _, _ in self.requests]

    def handle(self, key: str, body: Any, headers: dict[str, str]) -> Reply:
        with self.lock:
            seen = sum(1 for k, _, _ in self.requests if k == key)
            self.requests.append((key, body, headers))
            self.times.append(time.monotonic())
            if self.in_flight.get(key):
                self.overlaps.append(key)
            self.in_flight[key] = self.in_flight.get(key, 0) + 1
        reply = self.script(key, seen)
        try:
            if reply.delay:
                time.sleep(reply.delay)
            if 200 <= reply.status < 300:
                with self.lock:  # act once per key: a repeated key is answered, not acted on again
                    self.acted.setdefault(key, 1)
        finally:
            with self.lock:
                self.in_flight[key] -= 1
        return reply


def _handler(receiver: Receiver, keep_alive: bool) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.1 keeps connections open; TCP_NODELAY as a production server's sockets (else the
        # body, written after the headers, waits for the client's delayed ACK on a kept connection).
        protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"
        disable_nagle_algorithm = True

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            with receiver.lock:
                receiver.peers.append(self.client_address[1])
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"null")
            reply = receiver.handle(self.headers.get("Idempotency-Key") or "", body, dict(self.headers.items()))
            data = reply.body.encode()
            try:
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                pass

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def receiving(script: Script | None = None, *, keep_alive: bool = True) -> Iterator[Receiver]:
    """A receiver on 127.0.0.1 (a free port) for the block; ``script``: default always 200;
    ``keep_alive=False``: it closes each connection after its answer (HTTP/1.0)."""
    receiver = Receiver(script or (lambda key, seen: Reply()))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver, keep_alive))
    server.daemon_threads = True
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
