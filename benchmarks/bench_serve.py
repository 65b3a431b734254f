"""``rolecall serve`` under load: 64 HTTP clients against the same requests through ``LocalLM`` in-process.

One process loads the embedded SmolLM2-135M-Instruct once and runs the same workload on it two ways:

- ``direct``: ``--clients`` threads each make ``--requests`` greedy ``LocalLM.sample`` calls, one after another;
- ``served``: a :func:`rolecall.serve.make_server` server on a loopback port, and ``--clients`` threads each sending
  the same requests to ``/v1/chat/completions``, one after another over one kept-alive connection.

Both reach the same continuous batcher, so the difference is the HTTP layer (JSON, sockets, a handler thread per
client). The machine may be shared, and a ``nice``'d process's wall time then mostly measures the neighbours, so the
two ways alternate in ``--rounds`` rounds (each ``--requests / --rounds`` requests per client; the first of a round
alternates) after an untimed warm-up, and the process CPU time is reported beside the wall time: CPU seconds per
request do not depend on how much of the machine the process got.

Reported per way (all rounds together): wall and CPU seconds, requests/s, generated tokens/s, p50 / p95 / max
latency, lost requests (no 200 with a completion), the batcher's max and mean rows per decode step; then the served /
direct ratios of throughput and of CPU seconds per request, and how many greedy answers agree between the two ways
(bf16 rounding depends on the batch a row decodes in, so greedy answers can differ where two tokens nearly tie).

Example:
    nice .venv/bin/python benchmarks/bench_serve.py                  # 64 clients x 8 requests, 16 tokens each
    nice .venv/bin/python benchmarks/bench_serve.py --clients 16 --requests 4 --rounds 2
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from _common import bench_parser, write_results

SUBJECTS = ["rivers", "bridges", "castles", "volcanoes", "libraries", "harbours", "glaciers", "deserts"]


def conversation(client: int, turn: int) -> list[dict[str, str]]:
    """A short, distinct question per (client, turn)."""
    subject = SUBJECTS[(client + turn) % len(SUBJECTS)]
    return [{"role": "user", "content": f"In one sentence, why do people visit {subject}? (#{client}.{turn})"}]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class Tally:
    """What one way's runs added up to."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    lost: int = 0
    tokens: int = 0
    steps: int = 0
    row_steps: int = 0
    max_rows: int = 0
    latencies: list[float] = field(default_factory=list)
    round_walls: list[float] = field(default_factory=list)
    texts: dict[tuple[int, int], str] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        done = len(self.latencies)
        return {
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            "requests": done,
            "lost_requests": self.lost,
            "requests_per_s": done / self.wall_s,
            "generated_tokens": self.tokens,
            "tokens_per_s": self.tokens / self.wall_s,
            "cpu_ms_per_request": 1000 * self.cpu_s / max(done, 1),
            "latency_p50_s": percentile(self.latencies, 0.50),
            "latency_p95_s": percentile(self.latencies, 0.95),
            "latency_max_s": max(self.latencies),
            "batcher_max_rows": self.max_rows,
            "batcher_mean_rows": self.row_steps / max(self.steps, 1),
            "batcher_steps": self.steps,
            "wall_s_per_round": self.round_walls,
        }


def run(
    tally: Tally,
    backend: Any,
    clients: int,
    turns: range,
    one: Callable[[Any, int, int], tuple[str, int]],
    session: Callable[[], Any],
) -> None:
    """``clients`` threads, each making the calls ``one(session(), client, turn) -> (text, tokens)`` of ``turns``."""
    backend.batcher.stats = type(backend.batcher.stats)()  # this run's counters only
    lock = threading.Lock()

    def client(c: int) -> None:
        state = session()
        for t in turns:
            started = time.perf_counter()
            try:
                text, n = one(state, c, t)
            except Exception as err:  # noqa: BLE001 - a lost request is counted, not fatal
                logging.warning("request %d.%d failed: %s", c, t, err)
                with lock:
                    tally.lost += 1
                continue
            with lock:
                tally.latencies.append(time.perf_counter() - started)
                tally.texts[(c, t)] = text
                tally.tokens += n

    wall, cpu = time.perf_counter(), time.process_time()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    tally.round_walls.append(time.perf_counter() - wall)
    tally.wall_s += tally.round_walls[-1]
    tally.cpu_s += time.process_time() - cpu
    stats = backend.batcher.stats
    tally.steps, tally.row_steps = tally.steps + stats.steps, tally.row_steps + stats.row_steps
    tally.max_rows = max(tally.max_rows, stats.max_rows)


def main() -> None:
    parser = bench_parser(__doc__, "bench_serve")
    parser.add_argument("--clients", type=int, default=64, help="concurrent client threads (default 64)")
    parser.add_argument("--requests", type=int, default=8, help="requests per client, one after another (default 8)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds the two ways alternate in (default 4)")
    parser.add_argument("--max-tokens", type=int, default=16, help="completion budget of each request (default 16)")
    parser.add_argument("--max-batch-rows", type=int, default=32, help="the batcher's rows per step (default 32)")
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"), help="default auto")
    parser.add_argument("--warmup", type=int, default=2, help="untimed requests per client first (default 2)")
    args = parser.parse_args()
    if args.requests % args.rounds:
        parser.error(f"--requests ({args.requests}) must be a multiple of --rounds ({args.rounds})")
    logging.basicConfig(level=logging.WARNING)

    from rolecall.lm import LocalLM
    from rolecall.serve import make_server

    lm = LocalLM(dtype=args.dtype, max_batch_rows=args.max_batch_rows, cache=False)
    backend = lm.backend
    server = make_server(lm, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host, port = server.server_address[:2]

    def direct(_: Any, c: int, t: int) -> tuple[str, int]:
        out = lm.sample(conversation(c, t), temperature=0.0, max_tokens=args.max_tokens)[0]
        return out.text, out.completion_tokens

    def served(conn: http.client.HTTPConnection, c: int, t: int) -> tuple[str, int]:
        body = {"messages": conversation(c, t), "temperature": 0, "max_tokens": args.max_tokens}
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        answer = json.loads(resp.read())
        if resp.status != 200 or len(answer.get("choices", [])) != 1:
            raise RuntimeError(f"HTTP {resp.status}: {answer}")
        return answer["choices"][0]["message"]["content"], answer["usage"]["completion_tokens"]

    def connection() -> http.client.HTTPConnection:
        return http.client.HTTPConnection(host, port, timeout=600)

    print(f"bench_serve: {args.clients} clients x {args.requests} requests in {args.rounds} rounds, "
          f"{args.max_tokens} tokens, greedy")  # fmt: skip
    if args.warmup:  # the first batches of each size and length are slow (allocator, oneDNN kernels): not measured
        run(Tally(), backend, args.clients, range(-args.warmup, 0), served, connection)
    ways = {"direct": (Tally(), direct, lambda: None), "served": (Tally(), served, connection)}
    per_round = args.requests // args.rounds
    load_average = [os.getloadavg()]
    for r in range(args.rounds):
        for name in ("direct", "served") if r % 2 == 0 else ("served", "direct"):
            tally, one, session = ways[name]
            run(tally, backend, args.clients, range(r * per_round, (r + 1) * per_round), one, session)
        load_average.append(os.getloadavg())
        walls = {name: f"{ways[name][0].round_walls[-1]:.1f} s" for name in ways}
        print(f"  round {r + 1}/{args.rounds}: {walls} (load average {load_average[-1][0]:.1f})", flush=True)
    conn = connection()
    conn.request("GET", "/stats")
    server_stats = json.loads(conn.getresponse().read())
    conn.close()
    server.shutdown()
    server.server_close()

    results: dict[str, Any] = {"clients": args.clients, "requests_per_client": args.requests}
    for name, (tally, _, _) in ways.items():
        results[name] = s = tally.summary()
        print(
            f"  {name:7s} {s['wall_s']:6.1f} s ({s['cpu_s']:.0f} CPU s)  {s['requests_per_s']:6.2f} req/s  "
            f"{s['tokens_per_s']:6.1f} tok/s  {s['cpu_ms_per_request']:.0f} CPU ms/req  "
            f"p50 {s['latency_p50_s']:.2f} s  p95 {s['latency_p95_s']:.2f} s  lost {s['lost_requests']}  "
            f"rows max {s['batcher_max_rows']} mean {s['batcher_mean_rows']:.1f}"
        )
    d, s = results["direct"], results["served"]
    direct_texts, served_texts = ways["direct"][0].texts, ways["served"][0].texts
    agree = sum(served_texts.get(k) == v for k, v in direct_texts.items())
    results["served_vs_direct_requests_per_s"] = s["requests_per_s"] / d["requests_per_s"]
    results["served_vs_direct_tokens_per_s"] = s["tokens_per_s"] / d["tokens_per_s"]
    results["served_vs_direct_cpu_per_request"] = s["cpu_ms_per_request"] / d["cpu_ms_per_request"]
    results["greedy_answers_agree"] = f"{agree}/{len(direct_texts)}"
    results["load_average_per_round"] = load_average
    results["server_stats"] = server_stats
    print(
        f"  served / direct: {results['served_vs_direct_requests_per_s']:.2f}x requests/s, "
        f"{results['served_vs_direct_tokens_per_s']:.2f}x tokens/s, "
        f"{results['served_vs_direct_cpu_per_request']:.2f}x CPU per request; greedy answers agree {agree}/"
        f"{len(direct_texts)}"
    )
    print(f"wrote {write_results(results, args)}")


if __name__ == "__main__":
    main()
