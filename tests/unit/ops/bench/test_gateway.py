"""`bench gateway`'s pure parts (`ops/bench/gateway.py`): the closed loop, how runs pool into
per-path figures, the latency the gateway adds and the rounds' ratio, and the HTTP lane against
a canned server. The run itself: tests/integration/test_bench_gateway.py."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from gpu.engine_config import EngineConfig
from messages.openai_batch import COMPLETIONS_URL
from ops.bench.gateway import GatewayBenchOptions, Run, added, closed_loop, compare, figures
from ops.bench.gateway_process import HttpLane
from ops.models.engine_options import EngineChoice

CHOICE = EngineChoice(model="m", dtype=None, device=None, engine=EngineConfig())
CPU = {"client": 0.5, "gateway": 1.0, "worker": 2.0, "broker": None}


def _run(round_: int, path: str, latencies: Sequence[float | None], wall_s: float) -> Run:
    return Run(round_, path, list(latencies), wall_s, dict(CPU))


async def test_the_closed_loop_keeps_concurrency_requests_in_flight_and_times_each() -> None:
    called: list[int] = []
    in_flight = most = 0

    async def call(lane: int, i: int) -> bool:
        nonlocal in_flight, most
        assert 0 <= lane < 4
        called.append(i)
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0)  # a yield: the other lanes run
        in_flight -= 1
        return i % 5 != 0  # every fifth is not answered well

    latencies, wall_s = await closed_loop(call, 20, 4)

    assert sorted(called) == list(range(20))  # each request once
    assert most == 4
    assert [i for i, x in enumerate(latencies) if x is None] == [0, 5, 10, 15]
    assert all(x is None or 0 <= x <= wall_s * 1e3 for x in latencies)


async def test_fewer_requests_than_lanes_use_one_lane_each() -> None:
    lanes: list[int] = []

    async def call(lane: int, i: int) -> bool:
        lanes.append(lane)
        await asyncio.sleep(0)  # a yield: the other lanes run
        return True

    latencies, _ = await closed_loop(call, 2, 32)

    assert sorted(lanes) == [0, 1] and None not in latencies


def test_figures_pool_runs_over_their_summed_wall_time() -> None:
    pooled = figures([_run(1, "direct", [10.0, None], 1.0), _run(2, "direct", [30.0, 20.0], 2.0)])

    assert (pooled["requests"], pooled["ok"], pooled["errors"]) == (4, 3, 1)
    assert (pooled["wall_s"], pooled["requests_per_s"]) == (3.0, 1.0)
    assert pooled["latency_ms"] == {"p50": 20.0, "p99": 29.8}
    # CPU seconds summed by process (None where one run could not read it), and per wall s.
    assert pooled["cpu_s"] == {"client": 1.0, "gateway": 2.0, "worker": 4.0, "broker": None}
    assert pooled["cores_busy"] == {"client": 0.33, "gateway": 0.67, "worker": 1.33, "broker": None}


def test_compare_gives_the_added_latency_and_the_median_of_the_round_ratios() -> None:
    runs = [
        _run(1, "direct", [10.0] * 100, 1.0),  # 100 req/s
        _run(1, "gateway", [15.0] * 100, 2.0),  # 50 req/s: ratio 0.5
        _run(2, "gateway", [15.0] * 100, 1.0),  # gateway first in round 2: ratio 1.0
        _run(2, "direct", [10.0] * 100, 1.0),
        _run(3, "direct", [10.0] * 99 + [40.0], 1.0),
        _run(3, "gateway", [15.0] * 99 + [90.0], 1.25),  # 80 req/s: ratio 0.8
    ]

    out = compare(runs)

    assert out["ratios"] == [0.5, 1.0, 0.8]
    assert out["throughput_ratio"] == 0.8
    assert out["direct"]["requests_per_s"] == 100.0 and out["gateway"]["ok"] == 300
    # Percentiles of the two pooled distributions, subtracted (not per request).
    assert out["added_latency_ms"]["p50"] == 5.0
    d, g = out["direct"]["latency_ms"]["p99"], out["gateway"]["latency_ms"]["p99"]
    assert out["added_latency_ms"]["p99"] == round(g - d, 2)
    # The gateway process's CPU over the gateway path's answered requests: 3 s / 300.
    assert out["gateway_cpu_us_per_request"] == 10_000


def test_streamed_runs_give_the_added_latency_to_the_first_text_and_to_the_end() -> None:
    plain = [_run(1, "direct", [10.0] * 10, 1.0), _run(1, "gateway", [12.0] * 10, 1.0)]
    direct = _run(1, "direct-stream", [20.0] * 9 + [None], 1.0)
    direct.first_ms = [4.0] * 9 + [None]  # the unanswered request has no first text either
    gateway = _run(1, "gateway-stream", [23.0] * 10, 1.0)
    gateway.first_ms = [5.5] * 5 + [6.5] * 5

    out = compare([*plain, direct, gateway])

    assert out["direct-stream"]["first_text_ms"] == {"p50": 4.0, "p99": 4.0}
    assert out["gateway-stream"]["first_text_ms"] == {"p50": 6.0, "p99": 6.5}
    assert out["added_streamed_ms"] == {
        "first_text": {"p50": 2.0, "p99": 2.5},
        "end": {"p50": 3.0, "p99": 3.0},
    }
    assert out["added_latency_ms"] == {"p50": 2.0, "p99": 2.0}
    assert "first_text_ms" not in out["direct"]  # a plain path has no first text
    assert out["ratios"] == [1.0]  # the throughput ratio is the plain paths'


def test_added_is_none_where_either_percentile_is() -> None:
    assert added({"p50": 1.0, "p99": None}, {"p50": 3.5, "p99": 9.0}) == {"p50": 2.5, "p99": None}


def test_without_streamed_runs_there_is_no_streamed_figure() -> None:
    out = compare([_run(1, "direct", [1.0], 1.0), _run(1, "gateway", [2.0], 1.0)])
    assert "added_streamed_ms" not in out and "direct-stream" not in out


def test_a_round_with_no_answers_has_no_ratio_and_the_median_none() -> None:
    runs = [_run(1, "direct", [None], 1.0), _run(1, "gateway", [5.0], 1.0)]

    out = compare(runs)

    assert out["ratios"] == [None] and out["throughput_ratio"] is None
    assert out["added_latency_ms"] == {"p50": None, "p99": None}
    assert out["direct"]["errors"] == 1


def test_requests_per_run_default_by_engine_and_the_warm_up_follows() -> None:
    echo, torch = GatewayBenchOptions(CHOICE), GatewayBenchOptions(CHOICE, kind="torch")
    assert (echo.per_run, echo.warm_up) == (2000, 128)
    assert (torch.per_run, torch.warm_up) == (96, 96)
    small = GatewayBenchOptions(CHOICE, requests=10, concurrency=4)
    assert (small.per_run, small.warm_up) == (10, 10)


def _canned_server(closed: asyncio.Event) -> Any:
    """A handler answering each request on its connection with a 200 JSON body sent in two
    writes; `closed` is set once the client has gone and the connection is closed."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while b"content-length" in (head := await reader.readuntil(b"\r\n\r\n")):
                await reader.readexactly(int(head.split(b"content-length: ")[1].split(b"\r\n")[0]))
                writer.write(b'HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\n{"ok": ')
                await writer.drain()
                writer.write(b"true}")
        except asyncio.IncompleteReadError:  # the client closed the connection
            pass
        finally:
            writer.close()
            await writer.wait_closed()
            closed.set()

    return serve


async def test_an_http_lane_posts_twice_on_one_connection() -> None:
    closed = asyncio.Event()
    server = await asyncio.start_server(_canned_server(closed), "127.0.0.1", 0)
    lane = HttpLane(*await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1]))

    statuses = [await lane.post(COMPLETIONS_URL, b'{"prompt": [1]}') for _ in range(2)]

    assert statuses == [200, 200]
    assert lane.first_data_at is not None  # the last answer's first body bytes, stamped
    lane.writer.close()
    await lane.writer.wait_closed()
    await closed.wait()
    server.close()
    await server.wait_closed()
