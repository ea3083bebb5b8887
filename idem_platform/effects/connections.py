"""A dispatcher's kept-alive HTTP connections, one per receiver (scheme, host, port).

A dispatcher sends many requests to few receivers, one after the other. A new TCP (and TLS)
connection per request costs more than a small request itself: on loopback, 1.0-1.4 ms a
request on a new connection against 0.3-0.4 ms on a kept-alive one. So one ``deliver`` call
keeps one connection per receiver open while the receiver keeps it (HTTP/1.1 keep-alive)
and closes them all when it ends.

A connection is kept only in a known state: after a whole answer was read and the receiver
did not say it closes. After a timeout, an error, or an answer longer than what is read, it
is closed and the next request opens a new one. A kept connection the receiver closed in the
meantime (its idle timeout) fails the next request before any answer: that request is sent
once more on a new connection, under the same ``Idempotency-Key`` as every attempt.

Requests that a proxy would carry (``HTTP_PROXY``, ``HTTPS_PROXY``, unless ``NO_PROXY``
exempts the host) are not made here: :func:`direct` says so, and the caller sends them
through urllib, which honours those variables.
"""

from __future__ import annotations

import http.client
import ssl
import urllib.request
from dataclasses import dataclass
from email.message import Message
from types import TracebackType
from urllib.parse import urlsplit

# The failures of a kept connection the receiver closed before this request reached it.
_CLOSED_MEANWHILE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


def direct(url: str) -> bool:
    """Whether a request to ``url`` goes straight to its host (no proxy applies to it)."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    return parts.scheme in ("http", "https") and (
        parts.scheme not in proxies or bool(urllib.request.proxy_bypass(parts.hostname or ""))
    )


@dataclass(frozen=True)
class Response:
    """A receiver's answer: its status, headers and at most the first ``limit`` bytes of its body."""

    status: int
    headers: Message
    body: bytes


class Connections:
    """The open connections of one dispatcher, by (scheme, host, port); a context manager that
    closes them."""

    def __init__(self) -> None:
        self._open: dict[tuple[str, str, int | None], http.client.HTTPConnection] = {}
        self._tls: ssl.SSLContext | None = None

    def __enter__(self) -> Connections:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        for connection in self._open.values():
            connection.close()
        self._open.clear()

    def _new(self, scheme: str, host: str, port: int | None, timeout: float) -> http.client.HTTPConnection:
        if scheme == "https":
            if self._tls is None:
                self._tls = ssl.create_default_context()  # verifies the receiver, as urllib does
            return http.client.HTTPSConnection(host, port, timeout=timeout, context=self._tls)
        return http.client.HTTPConnection(host, port, timeout=timeout)

    def exchange(
        self, method: str, url: str, body: bytes, headers: dict[str, str], timeout: float, limit: int
    ) -> Response:
        """Send one request and read its answer (at most ``limit`` bytes of body).

        Raises:
            TimeoutError: no answer within ``timeout`` seconds (per socket operation).
            OSError, http.client.HTTPException: the receiver could not be reached or answered
                something that is not HTTP.
        """
        parts = urlsplit(url)
        where = (parts.scheme, parts.hostname or "", parts.port)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        kept = self._open.pop(where, None)
        try:
            return self._once(where, kept or self._new(*where, timeout), method, target, body, headers, timeout, limit)
        except _CLOSED_MEANWHILE:
            if kept is None:
                raise
        return self._once(where, self._new(*where, timeout), method, target, body, headers, timeout, limit)

    def _once(
        self, where: tuple[str, str, int | None], connection: http.client.HTTPConnection, method: str, target: str,
        body: bytes, headers: dict[str, str], timeout: float, limit: int,
    ) -> Response:
        """One request on ``connection``; the connection is kept for the next one only when the
        whole answer was read and the receiver keeps it open, else closed."""
        try:
            connection.timeout = timeout
            if connection.sock is not None:
                connection.sock.settimeout(timeout)
            connection.request(method, target, body=body, headers=headers)
            response = connection.getresponse()
            data = response.read(limit)
            whole = response.isclosed()  # http.client closes a response once its body is all read
        except BaseException:
            connection.close()
            raise
        if whole and not response.will_close:
            self._open[where] = connection
        else:
            connection.close()
        return Response(response.status, response.headers, data)
