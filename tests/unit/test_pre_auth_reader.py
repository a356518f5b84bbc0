"""A network peer that has not authenticated gets lines of 4 KiB, not 64 MiB (issue 45, a low):
console/transport/base.py's pre_auth_reader; once it has, an agent's long lines pass as before."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest
from mscon.console.transport import base


def test_a_pre_auth_line_past_4_kib_is_refused_and_little_is_held() -> None:
    """A real connection sends 16 MiB with no newline: readline fails, and the reader never held
    more than a few reads' worth (the transport pauses past twice the limit)."""

    async def main() -> tuple[type[BaseException] | None, int]:
        reader = base.pre_auth_reader()
        peak = [0]
        loop = asyncio.get_running_loop()
        got: asyncio.Future[tuple[type[BaseException] | None, int]] = loop.create_future()

        async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                await r.readline()
                got.set_result((None, 0))
            except (ValueError, asyncio.LimitOverrunError) as exc:
                got.set_result((type(exc), peak[0]))
            w.close()

        def factory() -> asyncio.StreamReaderProtocol:
            return asyncio.StreamReaderProtocol(reader, serve)

        feed = reader.feed_data

        def counted(data: bytes) -> None:
            feed(data)
            peak[0] = max(peak[0], len(reader._buffer))

        reader.feed_data = counted  # type: ignore[method-assign]
        server = await asyncio.get_running_loop().create_server(factory, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]

        def flood() -> None:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                try:
                    sock.sendall(b"x" * (16 << 20))
                except OSError:
                    pass  # closed under it: what is wanted

        t = threading.Thread(target=flood, daemon=True)
        t.start()
        result = await asyncio.wait_for(got, 30)
        server.close()
        await server.wait_closed()
        t.join(10)
        return result

    error, peak = asyncio.run(main())
    assert error is not None, "a 16 MiB line was read"
    assert peak < 1 << 20, f"{peak} bytes held for a peer that has not authenticated"


def test_the_limit_is_4_kib_before_and_lines_of_an_agent_after() -> None:
    async def main() -> None:
        reader = base.pre_auth_reader()
        reader.feed_data(b"mscon-dial 1 boot " + b"a" * 100 + b"\n")
        assert (await reader.readline()).startswith(b"mscon-dial")
        reader.feed_data(b"y" * (base.PRE_AUTH_LINE_LIMIT + 1) + b"\n")
        with pytest.raises(ValueError):
            await reader.readline()

        after = base.pre_auth_reader()
        base.authenticated(after)
        after.feed_data(b"z" * (5 << 20) + b"\n")
        assert len(await after.readline()) == (5 << 20) + 1

    asyncio.run(main())
