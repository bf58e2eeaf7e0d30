"""When a stream writes: keep-alive comments measured from the last write (docs/HTTP.md §4.3).

Driven on Trio's virtual clock (``autojump_clock``): the events arrive at exact virtual
times, so the schedule is checked to the instant without depending on this machine's speed.
test_http_concurrency.py checks the same comments over a socket.
"""

from __future__ import annotations

import math

import trio

from waste.adapters.http.exchange import PeerEof
from waste.adapters.http.generation import sse_writes
from waste.adapters.http.wire import SSE_KEEPALIVE

KEEPALIVE = 10.0


def render(event):
    """Events are strings here: "" writes nothing (the job left the queue), "END" ends."""
    return ("" if event == "END" else event), event == "END"


async def writes_at(schedule: list[tuple[float, str]], *,
                    eof_at: float | None = None) -> list[tuple[float, str]]:
    """Feed ``(time, event)`` pairs into a stream; return ``(time, write)`` for each write.
    ``eof_at``: when the client's end-of-input is seen."""
    send, receive = trio.open_memory_channel(math.inf)
    start = trio.current_time()
    out: list[tuple[float, str]] = []
    peer = PeerEof()

    async def feed() -> None:
        for at, event in schedule:
            await trio.sleep_until(start + at)
            send.send_nowait(event)

    async def eof() -> None:
        if eof_at is not None:
            await trio.sleep_until(start + eof_at)
            peer.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(feed)
        nursery.start_soon(eof)
        async for text in sse_writes(receive, render, keepalive_s=KEEPALIVE, first="role",
                                     peer=peer):
            out.append((round(trio.current_time() - start, 6), text))
    return out


async def test_a_silent_event_does_not_restart_the_interval(autojump_clock):
    # The role chunk at 0; the job starts at 9 s (writes nothing); prefill until 25 s.
    writes = await writes_at([(9.0, ""), (25.0, "token"), (26.0, "END")])
    assert writes == [(0.0, "role"), (10.0, SSE_KEEPALIVE), (20.0, SSE_KEEPALIVE),
                      (25.0, "token")]


async def test_every_write_restarts_it(autojump_clock):
    writes = await writes_at([(4.0, "a"), (13.0, "b"), (30.0, "END")])
    assert writes == [(0.0, "role"), (4.0, "a"), (13.0, "b"), (23.0, SSE_KEEPALIVE)]


async def test_after_the_clients_end_of_input_quiet_streams_probe_it(autojump_clock):
    # End-of-input at 3 s (while prefilling): a comment 20 ms later, then each wait three
    # times longer up to 2 s, so a client that left is found by a failed write within a few
    # round trips (docs/HTTP.md §6). A token written meanwhile counts as a probe.
    writes = await writes_at([(5.0, "token"), (10.0, "END")], eof_at=3.0)
    assert writes == [(0.0, "role"), (3.02, SSE_KEEPALIVE), (3.08, SSE_KEEPALIVE),
                      (3.26, SSE_KEEPALIVE), (3.8, SSE_KEEPALIVE), (5.0, "token"),
                      (6.62, SSE_KEEPALIVE), (8.62, SSE_KEEPALIVE)]


async def test_a_late_error_is_one_event_and_the_end(autojump_clock):
    def failing(event):
        raise RuntimeError("boom")

    send, receive = trio.open_memory_channel(math.inf)
    send.send_nowait("x")
    out = [text async for text in sse_writes(receive, failing, keepalive_s=KEEPALIVE)]
    assert len(out) == 1 and out[0].startswith('data: {"error":') and "internal_error" in out[0]
