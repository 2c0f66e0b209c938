"""Requests per second of `idempotent_retry.Transport` against httpx's own `HTTPTransport`,
sync, over loopback keep-alive connections to a Rust server that answers every request `200`
at once (the native module's `_testing.KeepAliveServer`, so the server's cost is small and
the same for both). Each run sends the same keyed JSON POSTs through one `httpx.Client`; the
runs alternate between the transports. Needs the module built with the `testing` feature,
best with `--release`:

    maturin develop --release --features testing
    python bench/transport_rps.py [--requests N] [--runs R]
"""

from __future__ import annotations

import argparse
import statistics
import time

import httpx

import idempotent_retry as ir
from idempotent_retry import _native


def run(transport: httpx.BaseTransport, url: str, requests: int) -> float:
    with httpx.Client(transport=transport) as client:
        # Warm the connection up outside the timing.
        client.post(url, json={"n": -1}, headers={"Idempotency-Key": "warm"})
        started = time.perf_counter()
        for n in range(requests):
            response = client.post(url, json={"n": n}, headers={"Idempotency-Key": f"op-{n}"})
            if response.status_code != 200:
                raise SystemExit(f"unexpected status {response.status_code}")
        return requests / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    server = _native._testing.KeepAliveServer()
    url = server.url("/v1/ops")
    results: dict[str, list[float]] = {"httpx.HTTPTransport": [], "idempotent_retry.Transport": []}
    for _ in range(args.runs):
        results["httpx.HTTPTransport"].append(run(httpx.HTTPTransport(), url, args.requests))
        results["idempotent_retry.Transport"].append(
            run(ir.Transport(retry_budget=True), url, args.requests)
        )
    base = statistics.median(results["httpx.HTTPTransport"])
    print(f"{args.runs} runs of {args.requests} keyed POSTs, loopback keep-alive, sync")
    print(f"{'transport':<28} {'median req/s':>12} {'runs':>40} {'ratio':>6}")
    for name, values in results.items():
        median = statistics.median(values)
        runs = " ".join(f"{value:.0f}" for value in values)
        print(f"{name:<28} {median:>12.0f} {runs:>40} {median / base:>6.2f}")


if __name__ == "__main__":
    main()
