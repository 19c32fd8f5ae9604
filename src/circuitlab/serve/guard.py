"""The explorer's ASGI guard: oversized bodies and, when asked, unknown Host headers are refused before the app
sees them; every response gets the security headers. Its errors are JSON like the app's."""
from __future__ import annotations

from circuitlab.atomic import json_text

SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    # Scripts and data from this server only; plotly sets inline styles and draws to data:/blob: images.
    (b"content-security-policy",
     b"default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
     b"object-src 'none'; base-uri 'none'; frame-ancestors 'none'"),
]


def _json_bytes(status: int, detail: str) -> tuple[list[tuple[bytes, bytes]], bytes]:
    body = json_text({"detail": detail}).encode()
    return [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())], body


class Guard:
    """Pure ASGI middleware: refuses oversized bodies (413) and, with allowed_hosts, unknown Host headers
    (400: a web page elsewhere cannot reach the local server through DNS rebinding); adds security
    headers to every response. Its errors are JSON like the app's."""

    def __init__(self, app, max_body_bytes: int, allowed_hosts: list[str] | None) -> None:
        self.app, self.max_body_bytes = app, max_body_bytes
        self.allowed_hosts = {h.lower() for h in allowed_hosts} if allowed_hosts is not None else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": list(message.get("headers", [])) + SECURITY_HEADERS}
            await send(message)

        async def refuse(status: int, detail: str) -> None:
            headers, body = _json_bytes(status, detail)
            await send_with_headers({"type": "http.response.start", "status": status, "headers": headers})
            await send_with_headers({"type": "http.response.body", "body": body})

        headers = dict(scope.get("headers") or [])
        if self.allowed_hosts is not None:
            host = _host_name(headers.get(b"host", b"").decode("latin-1"))
            if host not in self.allowed_hosts:
                await refuse(400, f"unexpected Host header {host!r}; open the explorer at http://127.0.0.1")
                return
        length = headers.get(b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                await refuse(400, "the Content-Length header is not a number")
                return
            if declared > self.max_body_bytes:
                await refuse(413, f"the request body is {declared} bytes; the limit is {self.max_body_bytes}")
                return
        # Read the whole body (it is small, or we stop at the limit), then replay it to the app.
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await refuse(413, f"the request body is over the limit of {self.max_body_bytes} bytes")
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send_with_headers)


def _host_name(host: str) -> str:
    """'127.0.0.1:8000' -> '127.0.0.1', '[::1]:8000' -> '::1'."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
