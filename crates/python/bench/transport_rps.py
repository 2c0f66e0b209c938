"""Requests per second of `idempotent_retry.Transport` / `AsyncTransport` against httpx's own
`HTTPTransport` / `AsyncHTTPTransport` and, when installed, httpx-retries' `RetryTransport`
around httpx's (POST allowed, so that it does retry them), over loopback keep-alive connections
to a Rust server that answers every request `200` at once (the native module's
`_testing.KeepAliveServer`, so the server's cost is small and the same for all). Each run
sends the same keyed JSON POSTs one after another through one client; the runs alternate
between the transports. Needs the module built with the `testing` feature, best with
`--release`:

    maturin develop --release --features testing
    python bench/transport_rps.py [--requests N] [--runs R]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Callable, Dict, List

import httpx

import idempotent_retry as ir
from idempotent_retry import _native

try:
    import httpx_retries
except ImportError:
    httpx_retries = None


def run_sync(transport: httpx.BaseTransport, url: str, requests: int) -> float:
    with httpx.Client(transport=transport) as client:
        # Warm the connection up outside the timing.
        client.post(url, json={"n": -1}, headers={"Idempotency-Key": "warm"})
        started = time.perf_counter()
        for n in range(requests):
            response = client.post(url, json={"n": n}, headers={"Idempotency-Key": f"op-{n}"})
            if response.status_code != 200:
                raise SystemExit(f"unexpected status {response.status_code}")
        return requests / (time.perf_counter() - started)


def run_async(transport: httpx.AsyncBaseTransport, url: str, requests: int) -> float:
    async def main() -> float:
        async with httpx.AsyncClient(transport=transport) as client:
            await client.post(url, json={"n": -1}, headers={"Idempotency-Key": "warm"})
            started = time.perf_counter()
            for n in range(requests):
                response = await client.post(
                    url, json={"n": n}, headers={"Idempotency-Key": f"op-{n}"}
                )
                if response.status_code != 200:
                    raise SystemExit(f"unexpected status {response.status_code}")
            return requests / (time.perf_counter() - started)

    return asyncio.run(main())


def retrying(inner):
    retry = httpx_retries.Retry(total=4, allowed_methods=["POST"], backoff_factor=0.5)
    return httpx_retries.RetryTransport(transport=inner, retry=retry)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    server = _native._testing.KeepAliveServer()
    url = server.url("/v1/ops")
    modes: Dict[str, Dict[str, Callable[[], float]]] = {
        "sync": {
            "httpx.HTTPTransport": lambda: run_sync(httpx.HTTPTransport(), url, args.requests),
            "idempotent_retry.Transport": lambda: run_sync(ir.Transport(), url, args.requests),
        },
        "async": {
            "httpx.AsyncHTTPTransport": lambda: run_async(
                httpx.AsyncHTTPTransport(), url, args.requests
            ),
            "idempotent_retry.AsyncTransport": lambda: run_async(
                ir.AsyncTransport(), url, args.requests
            ),
        },
    }
    if httpx_retries is not None:
        modes["sync"]["httpx_retries.RetryTransport"] = lambda: run_sync(
            retrying(httpx.HTTPTransport()), url, args.requests
        )
        modes["async"]["httpx_retries.RetryTransport"] = lambda: run_async(
            retrying(httpx.AsyncHTTPTransport()), url, args.requests
        )
    print(f"{args.runs} runs of {args.requests} keyed POSTs each, one at a time, loopback keep-alive")
    for mode, transports in modes.items():
        results: Dict[str, List[float]] = {name: [] for name in transports}
        for _ in range(args.runs):
            for name, run in transports.items():
                results[name].append(run())
        base = statistics.median(next(iter(results.values())))
        print(f"\n{mode:<5} {'transport':<33} {'median req/s':>12}  {'ratio':>5}  runs")
        for name, values in results.items():
            median = statistics.median(values)
            runs = " ".join(f"{value:.0f}" for value in values)
            print(f"{'':<5} {name:<33} {median:>12.0f}  {median / base:>5.2f}  {runs}")


if __name__ == "__main__":
    main()
