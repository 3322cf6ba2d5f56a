"""What the fakes' HTTP handlers share: keep-alive HTTP/1.1 and no access log on stderr."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler
from typing import Any


class QuietHandler(BaseHTTPRequestHandler):
    """An HTTP/1.1 request handler that logs nothing (the SDKs under test reuse connections)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return
