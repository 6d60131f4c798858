"""A delaying TCP relay: added round-trip latency between the controller and lab hosts.

``netem`` is not available on the lab's machines, so the benchmarks put this relay
between the controller and each lab host's sshd. Each direction holds every chunk
it reads for half the wanted round-trip time before sending it on, in order; the
bandwidth is not limited. Run as a program::

    python -m benchmarks.relay --rtt-ms 50 127.0.0.1:0=10.213.1.2:22 ...

It listens on each ``LISTEN`` address (port 0: any free port; lab and loopback
addresses only) and relays to its ``TARGET``. When every socket listens it prints
one line ``ready LISTEN_PORT=TARGET ...`` with the real ports, then serves until
killed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def receive() -> None:
        try:
            while data := await reader.read(65536):
                queue.put_nowait((loop.time() + delay, data))
        finally:
            queue.put_nowait((loop.time() + delay, b""))

    async def send() -> None:
        try:
            while True:
                due, data = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    break
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    await asyncio.gather(receive(), send(), return_exceptions=True)


async def _serve(pairs: list[tuple[str, int, str, int]], delay: float) -> None:
    servers, ready = [], []
    for listen_host, listen_port, target_host, target_port in pairs:

        async def handle(reader, writer, host=target_host, port=target_port):
            try:
                up_reader, up_writer = await asyncio.open_connection(host, port)
            except OSError:
                writer.close()
                return
            await asyncio.gather(_pump(reader, up_writer, delay), _pump(up_reader, writer, delay))

        server = await asyncio.start_server(handle, listen_host, listen_port)
        port = server.sockets[0].getsockname()[1]
        servers.append(server)
        ready.append(f"{listen_host}:{port}={target_host}:{target_port}")
    print("ready " + " ".join(ready), flush=True)
    await asyncio.gather(*(server.serve_forever() for server in servers))


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rtt-ms", type=float, required=True, help="added round-trip time")
    parser.add_argument("pairs", nargs="+", metavar="LISTEN=TARGET")
    args = parser.parse_args(argv)
    pairs = []
    for pair in args.pairs:
        listen, _, target = pair.partition("=")
        pairs.append((*_address(listen), *_address(target)))
    try:
        asyncio.run(_serve(pairs, args.rtt_ms / 2000))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
