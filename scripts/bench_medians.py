#!/usr/bin/env python3
"""Print the median of every criterion benchmark under target/criterion as a markdown table.

Usage: python3 scripts/bench_medians.py [GROUP_PREFIX...]

Reads target/criterion/<group>/<bench>/new/estimates.json (written by `cargo bench`); standard
library only. Medians are in the unit that fits (ns or us).
"""
import json
import pathlib
import sys

root = pathlib.Path(__file__).resolve().parent.parent / "target" / "criterion"
prefixes = sys.argv[1:]
rows = []
for estimates in sorted(root.glob("**/new/estimates.json")):
    bench = estimates.parent.parent
    name = str(bench.relative_to(root))
    if prefixes and not any(name.startswith(p) for p in prefixes):
        continue
    data = json.loads(estimates.read_text())
    median = data["median"]["point_estimate"]
    low = data["median"]["confidence_interval"]["lower_bound"]
    high = data["median"]["confidence_interval"]["upper_bound"]
    rows.append((name, median, low, high))

def fmt(ns):
    return f"{ns / 1000:.2f} us" if ns >= 1000 else f"{ns:.1f} ns"

print("| benchmark | median | 95% CI of the median |")
print("|---|---:|---|")
for name, median, low, high in rows:
    print(f"| {name} | {fmt(median)} | {fmt(low)} .. {fmt(high)} |")
