"""Reading a request body as it streams in, gunzipped, within the connector's size limit.

A body is never held whole by this layer: each chunk goes to a sink (a spool on disk
for NDJSON, a bounded buffer for OTLP), and the limit applies to the decoded bytes, so a
small gzip bomb is refused as soon as it inflates past ``max_body_bytes``.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator

from fastapi import Request

from idem_platform.sources.push.context import Refusal
from idem_platform.sources.push.landing import BodyTooLarge

_CHUNK = 1 << 16


class Gunzip:
    """Inflates a gzip body as RFC 1952 defines it: one or more members, back to back.

    ``zlib`` stops at the end of the first member (the rest waits in ``unused_data``)
    and says nothing when the input just ends inside a member: used alone, it lands
    the first member of a multi-member body, or the readable part of a cut one, and
    the client hears ``202`` for records that were lost. Here every member is
    inflated in turn, whatever follows a member must be another valid member, and
    :meth:`finish` refuses a stream that ends inside one; each problem is a
    :class:`Refusal` ``400`` raised before anything is landed.
    """

    def __init__(self) -> None:
        self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._member = 1
        self._started = False  # whether the current member has had any byte

    def feed(self, data: bytes) -> Iterator[bytes]:
        """The decoded bytes of ``data``, at most :data:`_CHUNK` at a time (a bomb stays bounded)."""
        while data:
            self._started = True
            try:
                out = self._inflate.decompress(data, _CHUNK)
            except zlib.error as exc:
                raise Refusal(400, self._undecodable(exc)) from None
            if out:
                yield out
            if self._inflate.eof:  # what follows a member must be the next member
                data = self._inflate.unused_data + self._inflate.unconsumed_tail
                self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
                self._member += 1
                self._started = False
            else:
                data = self._inflate.unconsumed_tail

    def finish(self) -> bytes:
        """The last decoded bytes; a stream that ends inside a member is refused."""
        if not self._started:
            return b""
        try:
            tail = self._inflate.flush()
        except zlib.error as exc:
            raise Refusal(400, self._undecodable(exc)) from None
        if not self._inflate.eof:
            raise Refusal(
                400,
                f"the gzip body is truncated: it ends inside gzip member {self._member} "
                "(no end-of-member trailer); nothing was landed, send the whole body",
            )
        return tail

    def _undecodable(self, exc: zlib.error) -> str:
        if self._member == 1:
            return f"the gzip body does not decompress ({exc}); nothing was landed"
        return (
            f"the gzip body has trailing bytes after gzip member {self._member - 1} that are not a "
            f"valid gzip member ({exc}); nothing was landed"
        )


async def read_body(request: Request, sink: Callable[[bytes], None], limit: int) -> None:
    """Stream the body into ``sink``, gunzipping ``Content-Encoding: gzip`` (:class:`Gunzip`:
    every member, nothing after them); the limit applies to the decoded bytes and is
    checked before reading when the length is known."""
    declared = request.headers.get("content-length")
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if declared is not None and declared.isdigit() and int(declared) > limit and encoding == "identity":
        raise BodyTooLarge(limit)
    if encoding not in ("identity", "gzip"):
        raise Refusal(415, f"Content-Encoding {encoding!r} is not supported (identity or gzip)")
    gunzip = Gunzip() if encoding == "gzip" else None
    async for chunk in request.stream():
        if gunzip is None:
            sink(chunk)
            continue
        for decoded in gunzip.feed(chunk):
            sink(decoded)
    if gunzip is not None:
        sink(gunzip.finish())
