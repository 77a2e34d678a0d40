"""The listening socket, bound before the model loads: a port out of range or already in use is one clear error
(exit 2) at start, not a traceback after a minute of loading."""

from __future__ import annotations

import socket

from ..errors import ArgumentError


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port, for `uvicorn.Server.run(sockets=[...])` (uvicorn listens on it)."""
    if not 1 <= port <= 65535:
        raise ArgumentError(f"--port must be between 1 and 65535, not {port}.")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ArgumentError(f"--host {host!r} is not an address this machine can listen on ({e.strerror}).") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: a restart reuses the port at once
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise ArgumentError(f"Cannot listen on {host}:{port}: {e.strerror or e} (is another server on that port? "
                            "Stop it or pick another --port).") from None
    sock.set_inheritable(True)
    return sock
