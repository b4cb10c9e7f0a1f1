"""One port in front of several dashboard processes: a TCP proxy that hands each new connection to
the next backend in turn, skipping backends that refuse it (a dashboard being restarted).

Standard library only, so that it runs in the dashboard's image (compose's ``fleet`` profile) and
beside ``bench/fleet_bench.py``. With --report-s it prints, that often when they changed, the
connections each backend answered, by the method of their first HTTP request:

    python bench/fleet_proxy.py --listen 0.0.0.0:8177 --backend dash-a:8177 --backend dash-b:8177
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
    """Copies ``reader`` to ``writer`` until either end closes; the bytes copied."""
    copied = 0
    try:
        while data := await reader.read(65536):
            writer.write(data)
            copied += len(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()
    return copied


def _method(first: bytes) -> str:
    """The HTTP method a connection's first bytes start with ("?" for anything else)."""
    word = first.split(b" ", 1)[0]
    return word.decode() if word.isalpha() and word.isupper() and len(word) <= 7 else "?"


async def _report(answered: collections.Counter, every_s: float) -> None:
    """Every ``every_s``, when they changed: "BACKEND answered N METHOD, ...; BACKEND answered ..."."""
    seen: collections.Counter = collections.Counter()
    while True:
        await asyncio.sleep(every_s)
        if answered != seen:
            seen = answered.copy()
            lines: dict[str, list[str]] = {}
            for (backend, method), n in sorted(seen.items()):
                lines.setdefault(backend, []).append(f"{n} {method}")
            print("fleet_proxy: " + "; ".join(f"{b} answered {', '.join(v)}" for b, v in lines.items()), flush=True)


async def serve(listen: tuple[str, int], backends: list[tuple[str, int]], report_s: float = 0) -> None:
    turn = itertools.cycle(range(len(backends)))
    answered: collections.Counter = collections.Counter()  # (backend, method) -> connections

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            first = await client_r.read(65536)
        except OSError:
            first = b""
        if not first:  # connected and left (a health check): no backend needed
            client_w.close()
            return
        start = next(turn)
        for i in range(len(backends)):
            backend = backends[(start + i) % len(backends)]
            try:
                up_r, up_w = await asyncio.open_connection(*backend)
                break
            except OSError:
                continue
        else:
            client_w.close()  # no backend up: the client's retry comes back later
            return
        up_w.write(first)
        _, back = await asyncio.gather(_pipe(client_r, up_w), _pipe(up_r, client_w))
        if back:
            answered[f"{backend[0]}:{backend[1]}", _method(first)] += 1

    server = await asyncio.start_server(handle, *listen)
    async with server:
        await asyncio.gather(server.serve_forever(), *([_report(answered, report_s)] if report_s > 0 else []))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT")
    parser.add_argument("--backend", action="append", required=True, help="HOST:PORT (repeat)")
    parser.add_argument("--report-s", type=float, default=0, help="print what each backend answered this often")
    args = parser.parse_args()
    asyncio.run(serve(_addr(args.listen), [_addr(b) for b in args.backend], args.report_s))


if __name__ == "__main__":
    main()
