"""One port in front of several dashboard processes: a TCP proxy that hands each new connection to
the next backend in turn, skipping backends that refuse it (a dashboard being restarted).

Standard library only, so that it runs in the dashboard's image (compose's ``fleet`` profile) and
beside ``bench/fleet_bench.py``:

    python bench/fleet_proxy.py --listen 0.0.0.0:8177 --backend dash-a:8177 --backend dash-b:8177
"""

from __future__ import annotations

import argparse
import asyncio
import itertools


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def serve(listen: tuple[str, int], backends: list[tuple[str, int]]) -> None:
    turn = itertools.cycle(range(len(backends)))

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        first = next(turn)
        for i in range(len(backends)):
            try:
                up_r, up_w = await asyncio.open_connection(*backends[(first + i) % len(backends)])
                break
            except OSError:
                continue
        else:
            client_w.close()  # no backend up: the client's retry comes back later
            return
        await asyncio.gather(_pipe(client_r, up_w), _pipe(up_r, client_w))

    server = await asyncio.start_server(handle, *listen)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT")
    parser.add_argument("--backend", action="append", required=True, help="HOST:PORT (repeat)")
    args = parser.parse_args()
    asyncio.run(serve(_addr(args.listen), [_addr(b) for b in args.backend]))


if __name__ == "__main__":
    main()
