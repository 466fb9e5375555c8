"""Where an export goes: a file for node_exporter's textfile collector, or ``/metrics`` over HTTP.

Neither is on unless asked.  The file is replaced whole (a temporary file in the same directory, then a
rename), so the collector never reads half a scrape; it is made readable by others (0644), as the
collector runs as its own user.  The server listens on loopback unless given a host, answers ``/metrics``
and nothing else, and hands out the latest scrape the exporter made: a scrape never waits for the runs to
be read, and two scrapes never read them at once.  Mistakes a user can fix (a port in use, an address not
of this machine, a directory that cannot be written) raise ``OutputError`` with what to type instead.
"""

from __future__ import annotations

import errno
import os
import socket
import socketserver
import tempfile
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from shardtop.export.exposition import CONTENT_TYPE

LOOPBACK = "127.0.0.1"
TEXTFILE_SUFFIX = ".prom"
"""node_exporter's textfile collector reads only the files of its directory that end so."""
TEXTFILE_MODE = 0o644
METRICS_PATH = "/metrics"


class OutputError(Exception):
    """An output that cannot be opened as asked; the message says what to type instead."""


@dataclass(frozen=True)
class ListenAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_listen(text: str) -> ListenAddress:
    """``9400`` (loopback), ``0.0.0.0:9400``, ``localhost:9400``, ``[::1]:9400``; ValueError otherwise."""
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host = LOOPBACK
    elif host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{text!r}: put an IPv6 address in brackets, e.g. --listen [::1]:9400")
    if sep and not host:
        raise ValueError(f"{text!r}: name the host before the colon (127.0.0.1:9400, or 0.0.0.0:9400 for every "
                         "interface), or give the port alone for loopback: --listen 9400")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"{text!r}: expected [HOST:]PORT with a port from 0 to 65535, e.g. --listen 9400")
    return ListenAddress(host, int(port_text))


class _MetricsServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, family: socket.AddressFamily, sockaddr: tuple[str, int]) -> None:
        self.address_family = family
        self.latest = b""
        self.served = threading.Event()
        super().__init__(sockaddr, _MetricsHandler)

    def server_bind(self) -> None:
        """Bound without ``HTTPServer``'s reverse lookup of the host's name (slow where DNS is)."""
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)


class _MetricsHandler(BaseHTTPRequestHandler):
    server: _MetricsServer

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path.split("?", 1)[0] != METRICS_PATH:
            self._answer(404, b"shardtop serves /metrics only\n", "text/plain; charset=utf-8")
            return
        self._answer(200, self.server.latest, CONTENT_TYPE)
        self.server.served.set()

    def _answer(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's signature
        """A scrape every few seconds is not news: nothing on stderr."""


class MetricsServer:
    """``/metrics`` on one address, served from a thread; ``publish`` hands it the latest scrape."""

    def __init__(self, address: ListenAddress) -> None:
        try:
            family, _, _, _, sockaddr = socket.getaddrinfo(
                address.host, address.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        except (socket.gaierror, UnicodeError) as e:
            raise OutputError(f"cannot listen on {address}: no such host ({e}); try --listen {address.port} "
                              f"(loopback) or --listen 0.0.0.0:{address.port}") from None
        try:
            self._server = _MetricsServer(family, (str(sockaddr[0]), int(sockaddr[1])))
        except OSError as e:
            raise OutputError(_bind_problem(address, e)) from None
        self.address = ListenAddress(address.host, self._server.server_address[1])
        self._thread: threading.Thread | None = None

    @property
    def served(self) -> threading.Event:
        """Set once a scrape of ``/metrics`` was answered."""
        return self._server.served

    def publish(self, text: str) -> None:
        self._server.latest = text.encode()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name="shardtop-metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()


def _bind_problem(address: ListenAddress, e: OSError) -> str:
    if e.errno == errno.EADDRINUSE:
        return (f"cannot listen on {address}: the port is in use (another exporter?); pick another, "
                f"e.g. --listen {address.host}:{address.port + 1 if address.port < 65535 else 9400}")
    if e.errno == errno.EADDRNOTAVAIL:
        return (f"cannot listen on {address}: {address.host} is not an address of this machine; "
                f"try --listen {address.port} (loopback) or --listen 0.0.0.0:{address.port}")
    if e.errno == errno.EACCES:
        return f"cannot listen on {address}: ports below 1024 need privileges; pick one above, e.g. --listen 9400"
    return f"cannot listen on {address}: {e.strerror or e}"


class TextFile:
    """node_exporter's textfile: checked when made, then replaced whole at each ``write``."""

    def __init__(self, path: Path) -> None:
        path = path.expanduser()
        if path.is_dir():
            raise OutputError(f"{path} is a directory; name a file in it, e.g. --textfile {path / 'shardtop.prom'}")
        if path.suffix != TEXTFILE_SUFFIX:
            raise OutputError(f"{path}: node_exporter's textfile collector reads only files ending in "
                              f"{TEXTFILE_SUFFIX}; try --textfile {path.with_name(path.name + TEXTFILE_SUFFIX)}")
        if not path.parent.is_dir():
            raise OutputError(f"{path}: no directory {path.parent}; give the directory of node_exporter's "
                              "--collector.textfile.directory, e.g. --textfile /var/lib/node_exporter/shardtop.prom")
        self.path = path

    def write(self, text: str) -> None:
        """Replace the file with ``text``; OSError where it cannot be (the first write is ``check``'s)."""
        fd, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                os.fchmod(f.fileno(), TEXTFILE_MODE)
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    def check(self, text: str) -> None:
        """The first write: a file that cannot be written is the user's to fix, said as ``OutputError``."""
        try:
            self.write(text)
        except OSError as e:
            raise OutputError(f"cannot write {self.path}: {e.strerror or e}; pick a directory you can write to, "
                              "e.g. --textfile ./shardtop.prom") from None
