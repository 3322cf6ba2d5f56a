"""What the fakes' HTTP servers share: keep-alive HTTP/1.1, no access log on stderr, their loopback URL."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any


class QuietHandler(BaseHTTPRequestHandler):
    """An HTTP/1.1 request handler that logs nothing (the SDKs under test reuse connections)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return


def loopback_url(server: HTTPServer | None) -> str:
    """The base URL of a started fake's server on 127.0.0.1."""
    assert server is not None, "the fake is not started"
    return f"http://127.0.0.1:{server.server_address[1]}"
