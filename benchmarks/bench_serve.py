"""Serving throughput: ``tformer serve`` under 1, 4 and 16 concurrent clients.

Starts ``tformer serve -m RUN`` in a process of its own on a free local port, then for each
sentence set (the toy test sources; Multi30k's test2016 sources in the run's source language
too, from ``--data DIR`` or ``../shared/data/multi30k`` where it exists) and each search
(greedy, then beam 5) runs N clients as asyncio tasks with ``httpx`` for ``--seconds``: each
sends one sentence per request and waits for the answer before the next. Prints requests/s,
sentences/s, p50/p95 latency, errors, the mean decoding batch (requests per batch, from the
server's ``/health`` counters) and the speed-up over one client: batching works when 16 clients
get several times one client's sentences/s.

``--soak MINUTES`` instead runs the largest number of clients for that long, each sending beam
5 translations with the 3 best, attention maps (2 requests in 10) and bad requests (1 in 10,
answered 422), and samples the server process's resident memory (VmRSS and RssAnon
from ``/proc``) every second: it prints both every 30 s, the 5xx answers, and how much the
resident set grew over the last 3 minutes (from minute 2 of a 5-minute soak to its end).

    python benchmarks/bench_serve.py -m runs/toy                   # 60 s per row
    python benchmarks/bench_serve.py -m runs/toy --seconds 20 --json serve.json
    python benchmarks/bench_serve.py -m runs/toy --soak 5          # memory under 16 clients
    python benchmarks/bench_serve.py -m runs/m30k --data path/to/multi30k --soak 5
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import torch

from tformer_cli.device import cpu_model

REPO = Path(__file__).resolve().parents[1]
MULTI30K = REPO.parent / "shared" / "data" / "multi30k"


@dataclass
class Row:
    data: str
    search: str
    clients: int
    requests: int
    seconds: float
    requests_per_s: float
    sentences_per_s: float
    p50_ms: float
    p95_ms: float
    errors: int
    mean_batch: float
    speedup: float = 1.0


def sentence_sets(run: str, multi30k: Path) -> dict[str, list[str]]:
    """The toy test sources and, where ``multi30k`` holds them, Multi30k's test2016 sources in
    the run's source language."""
    toy = REPO / "data" / "toy" / "test.tsv"
    sets = {"toy": [line.split("\t")[0] for line in toy.read_text("utf-8").splitlines()]}
    config = json.loads((Path(run) / "config.json").read_text("utf-8"))
    sources = multi30k / f"test2016.{config['train']['src_lang']}"
    if sources.is_file():
        sets["multi30k"] = [s for s in sources.read_text("utf-8").splitlines() if s.strip()]
    return sets


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(run: str, port: int, threads: int, wait_ms: float) -> subprocess.Popen:
    """``tformer serve`` in a child process; returns once ``/health`` answers."""
    env = {**os.environ, "TFORMER_THREADS": str(threads)} if threads else dict(os.environ)
    cmd = [sys.executable, "-m", "tformer_cli", "serve", "-m", run, "--port", str(port), "-q"]
    cmd += ["--wait-ms", str(wait_ms)]
    proc = subprocess.Popen(cmd, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"tformer serve exited with code {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("tformer serve did not answer /health within 120 s")


Request = tuple[str, dict, int]  # (path, JSON body, the status that answers it right)


def translation(beam: int) -> Callable[[int, str], Request]:
    """One sentence translated with ``beam``, as every request of a table's row."""
    return lambda n, text: ("/translate", {"texts": [text], "beam": beam}, 200)


def soak_request(n: int, text: str) -> Request:
    """The soak's mix, request ``n``: one in ten a bad request (beam 0: a 422), two in ten an
    attention map (beam 5), the rest beam 5 translations with the 3 best."""
    if n % 10 == 9:
        return "/translate", {"texts": [text], "beam": 0}, 422
    if n % 10 in (0, 5):
        return "/attention", {"text": text, "beam": 5}, 200
    return "/translate", {"texts": [text], "beam": 5, "nbest": 3}, 200


async def load(
    url: str, sentences: list[str], request: Callable[[int, str], Request], clients: int,
    seconds: float, failed: list[int] | None = None,
) -> tuple[list[float], int, float]:  # fmt: skip
    """``clients`` tasks, each posting ``request(n, text)`` for the n-th sentence, one at a
    time, until ``seconds`` pass: the latencies of the requests answered as expected, the count
    of the others, and the wall time until all ended; ``failed`` collects the status of each of
    those (0: no answer)."""
    latencies: list[float] = []
    errors = 0
    counter = iter(range(10**9))
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        start = time.perf_counter()
        deadline = start + seconds

        async def client() -> None:
            nonlocal errors
            while time.perf_counter() < deadline:
                n = next(counter)
                path, body, expected = request(n, sentences[n % len(sentences)])
                sent = time.perf_counter()
                status = 0
                try:
                    r = await http.post(path, json=body)
                    status = r.status_code
                    ok = status == expected and (status != 200 or bool(r.json()))
                except httpx.HTTPError:
                    ok = False
                if ok:
                    latencies.append(time.perf_counter() - sent)
                else:
                    errors += 1
                    if failed is not None:
                        failed.append(status)

        await asyncio.gather(*(client() for _ in range(clients)))
        return latencies, errors, time.perf_counter() - start


def measure(
    url: str, data: str, sentences: list[str], beam: int, clients: int, seconds: float
) -> Row:
    before = httpx.get(f"{url}health").json()
    latencies, errors, wall = asyncio.run(load(url, sentences, translation(beam), clients, seconds))
    after = httpx.get(f"{url}health").json()
    batches = max(1, after["batches"] - before["batches"])
    ms = sorted(1000 * x for x in latencies) or [float("nan")]
    return Row(
        data=data,
        search="greedy" if beam == 1 else f"beam {beam}",
        clients=clients,
        requests=len(latencies),
        seconds=wall,
        requests_per_s=len(latencies) / wall,
        sentences_per_s=len(latencies) / wall,  # one sentence per request
        p50_ms=statistics.median(ms),
        p95_ms=ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))],
        errors=errors,
        mean_batch=(after["requests"] - before["requests"]) / batches,
    )


def resident_mib(pid: int) -> tuple[float, float]:
    """The process's VmRSS and RssAnon in MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon"):
            fields[key] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["RssAnon"]


def soak(url: str, pid: int, sentences: list[str], clients: int, minutes: float) -> dict:
    """``clients`` clients sending ``soak_request``'s mix for ``minutes`` while the server's
    resident memory is sampled each second; prints a line every 30 s and returns the record."""
    samples: list[tuple[float, float, float]] = []  # (seconds, VmRSS, RssAnon)
    failed: list[int] = []
    done = threading.Event()

    def sample() -> None:
        start = time.monotonic()
        while not done.is_set():
            elapsed = time.monotonic() - start
            samples.append((elapsed, *resident_mib(pid)))
            if len(samples) % 30 == 1:
                print(f"{elapsed / 60:5.1f} min  RSS {samples[-1][1]:7,.0f} MiB  anonymous "
                      f"{samples[-1][2]:7,.0f} MiB  failed {len(failed)}", flush=True)  # fmt: skip
            done.wait(1.0)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        latencies, errors, wall = asyncio.run(
            load(url, sentences, soak_request, clients, 60 * minutes, failed)
        )
    finally:
        done.set()
        sampler.join()
    start = next(s for s in samples if s[0] >= max(0.0, 60 * minutes - 180))  # the last 3 min
    end = samples[-1]
    record = {
        "clients": clients,
        "minutes": minutes,
        "requests": len(latencies),
        "requests_per_s": len(latencies) / wall,
        "errors": errors,
        "5xx": sum(500 <= f < 600 for f in failed),
        "rss_mib_at": {f"{s[0] / 60:.1f}": round(s[1]) for s in samples[::30]},
        "anon_mib_at": {f"{s[0] / 60:.1f}": round(s[2]) for s in samples[::30]},
        "last_3_min": {
            "from_min": round(start[0] / 60, 1),
            "rss_from": start[1],
            "rss_to": end[1],
            "growth": end[1] / start[1] - 1,
            "anon_from": start[2],
            "anon_to": end[2],
        },
        "peak_rss_mib": max(s[1] for s in samples),
    }
    last = record["last_3_min"]
    print(f"{len(latencies):,} requests answered as expected ({record['requests_per_s']:.1f}/s), "
          f"{errors} not, "
          f"{record['5xx']} 5xx; RSS over the last 3 minutes: {last['rss_from']:,.0f} -> "
          f"{last['rss_to']:,.0f} MiB ({100 * last['growth']:+.1f}%), anonymous "
          f"{last['anon_from']:,.0f} -> {last['anon_to']:,.0f} MiB; peak "
          f"{record['peak_rss_mib']:,.0f} MiB", flush=True)  # fmt: skip
    return record


def table(rows: list[Row]) -> str:
    """The rows as a Markdown table (the README's)."""
    head = (
        "| sentences | search | clients | requests/s | sentences/s | p50 ms | p95 ms | errors"
        " | mean batch | speed-up |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    lines = [
        f"| {r.data} | {r.search} | {r.clients} | {r.requests_per_s:.1f} | "
        f"{r.sentences_per_s:.1f} | {r.p50_ms:.0f} | {r.p95_ms:.0f} | {r.errors} | "
        f"{r.mean_batch:.1f} | {r.speedup:.1f}x |"
        for r in rows
    ]
    return "\n".join([head, *lines])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", required=True, help="run folder (e.g. runs/toy)")
    parser.add_argument("--seconds", type=float, default=60, help="seconds per row")
    parser.add_argument("--clients", default="1,4,16", help="concurrent clients, comma-separated")
    parser.add_argument("--beams", default="1,5", help="beam sizes (1: greedy)")
    parser.add_argument("--threads", type=int, default=1, help="server torch threads (0: all)")
    parser.add_argument("--wait-ms", type=float, default=5, help="tformer serve --wait-ms")
    parser.add_argument("--json", type=Path, help="write the rows and the machine here")
    parser.add_argument("--soak", type=float, help="minutes of the memory soak (no table)")
    parser.add_argument("--data", type=Path, help="the Multi30k folder (test2016.<src>)")
    args = parser.parse_args()
    if not (Path(args.model) / "config.json").is_file():
        parser.error(f"{args.model} is not a run folder: it has no config.json")
    if args.data is not None and not any(args.data.glob("test2016.*")):
        parser.error(f"{args.data} holds no test2016.<language> file")
    clients = [int(c) for c in args.clients.split(",")]
    beams = [int(b) for b in args.beams.split(",")]
    machine = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "server_threads": args.threads,
        "wait_ms": args.wait_ms,
        "seconds_per_row": args.seconds,
        "run": Path(args.model).name,
    }
    print(" · ".join(f"{k}: {v}" for k, v in machine.items()), flush=True)
    port = free_port()
    server = start_server(args.model, port, args.threads, args.wait_ms)
    url = f"http://127.0.0.1:{port}/"
    rows: list[Row] = []
    if args.soak is not None:
        sets = sentence_sets(args.model, args.data or MULTI30K)
        data, sentences = list(sets.items())[-1]  # Multi30k where it is there
        print(f"soak: {max(clients)} clients on {data} for {args.soak:g} min", flush=True)
        try:
            record = soak(url, server.pid, sentences, max(clients), args.soak)
        finally:
            server.terminate()
            server.wait(timeout=30)
        if args.json is not None:
            text = json.dumps({"machine": machine, "soak": record}, indent=2) + "\n"
            args.json.write_text(text, encoding="utf-8")
        return
    try:
        for data, sentences in sentence_sets(args.model, args.data or MULTI30K).items():
            measure(url, data, sentences, 1, 1, 2)  # warm-up
            for beam in beams:
                first = None
                for n in clients:
                    row = measure(url, data, sentences, beam, n, args.seconds)
                    first = first or row.sentences_per_s
                    row.speedup = row.sentences_per_s / first
                    rows.append(row)
                    print(table([row]).splitlines()[-1], flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
    print()
    print(table(rows))
    if args.json is not None:
        record = {"machine": machine, "rows": [asdict(r) for r in rows]}
        args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
