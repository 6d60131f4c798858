"""The lab's apt repository server: read-only HTTP on the lab hosts' gateway addresses.

``up`` runs this file as a detached program (standard library only, so it
runs as ``python3 -I reposerver.py``)::

    reposerver.py --root DIR --port PORT ADDRESS [ADDRESS...]

It listens on ``ADDRESS:PORT`` for each address (one socket each, never on
all addresses) and answers GET and HEAD with the files below ``DIR``;
anything else is refused, and so are directory listings. Below ``/v2/`` it
answers as a read-only Docker registry does (lab/registry.py): ``/v2/`` itself
with 200, manifests with their media type. Requests are logged
to stderr, which the lab sends to a log file. When every socket is bound it
writes a line starting with :data:`READY` so the lab knows it is serving.
"""

from __future__ import annotations

import argparse
import functools
import io
import os
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

READY = "listening on"
# The media type of the manifests the lab's registry serves (lab/registry.py).
MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"


class _Server(ThreadingHTTPServer):
    # A whole fleet running apt at once should not find the queue full.
    request_queue_size = 128


class _ReadOnlyFiles(SimpleHTTPRequestHandler):
    """Files below the root for GET and HEAD (the only methods it has), no listings."""

    server_version = "sparkrig-lab-apt"

    def end_headers(self) -> None:
        if self.path.startswith("/v2/"):
            self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        super().end_headers()

    def send_head(self):
        if self.path.split("?")[0] in ("/v2", "/v2/"):  # the registry API's version check
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            return io.BytesIO(b"{}")
        return super().send_head()

    def guess_type(self, path) -> str:
        if "/v2/" in str(path) and "/manifests/" in str(path):
            return MANIFEST_TYPE
        return super().guess_type(path)

    def list_directory(self, path: str | os.PathLike[str]) -> None:
        self.send_error(404, "no directory listings here")
        return None

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write(f"{self.address_string()} {self.log_date_time_string()} {format % args}\n")
        sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    """Serve until killed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="directory to serve")
    parser.add_argument("--port", required=True, type=int)
    parser.add_argument("addresses", nargs="+", help="IPv4 addresses to listen on")
    args = parser.parse_args(argv)
    root = os.path.abspath(args.root)
    os.chdir("/")
    handler = functools.partial(_ReadOnlyFiles, directory=root)
    servers = []
    for address in args.addresses:
        try:
            servers.append(_Server((address, args.port), handler))
        except OSError as error:
            sys.stderr.write(f"cannot listen on {address}:{args.port}: {error}\n")
            return 1
    urls = ", ".join(f"http://{address}:{args.port}/" for address in args.addresses)
    sys.stderr.write(f"{READY} {urls} serving {root}\n")
    sys.stderr.flush()
    for server in servers[1:]:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    servers[0].serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
