#!/usr/bin/env python3
"""Fails when the README, the docs or the current release's CHANGELOG name a path, a feature,
an example, a bench or a package that this checkout does not have.

What is checked, in Markdown files (README.md, docs/*.md, crates/*/README.md) and in the
CHANGELOG's first (unreleased) section:

- a path in backticks that starts with a folder of the repository (`src/...`, `crates/...`,
  `docs/...`, `tests/...`, `examples/...`, `benches/...`, `scripts/...`, `.ci/...`, `fuzz/...`)
  must exist (a `:line` suffix and a `#anchor` are ignored; globs and `...` are skipped);
- "feature `X`", `--features X,Y` and `features = ["X"]` must name a feature of a crate of the
  workspace (or `default`);
- `--example X` and `--bench X` must name a file under `examples/` or `benches/`;
- `-p NAME` and "the crate `NAME`" must name a package of the workspace.

A CHANGELOG line that says what is gone or was renamed names the old thing on purpose: lines
with "is gone", "are gone", "removed", "renamed", "was", "were" or "instead of" are skipped.

Usage: python3 scripts/docs_names.py (from the repository root); exit 1 with one line per
stale name.
"""

import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
FOLDERS = ("src/", "crates/", "docs/", "tests/", "examples/", "benches/", "scripts/", ".ci/", "fuzz/")
# What a run writes, not what the checkout has.
GENERATED = ("fuzz/artifacts", "fuzz/corpus", "target/")
HISTORY = re.compile(r"is gone|are gone|removed|renamed|\bwas\b|\bwere\b|instead of")


def workspace():
    """Package names and the union of their features."""
    packages, features = set(), {"default"}
    for manifest in [ROOT / "Cargo.toml", *sorted(ROOT.glob("crates/*/Cargo.toml"))]:
        data = tomllib.loads(manifest.read_text())
        if "package" in data:
            packages.add(data["package"]["name"])
        features.update(data.get("features", {}))
    return packages, features


def texts():
    """(file name, line number, line) of every line checked."""
    files = [ROOT / "README.md", *sorted(ROOT.glob("docs/*.md")), *sorted(ROOT.glob("crates/*/README.md"))]
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            yield path.relative_to(ROOT), number, line, False
    changelog = (ROOT / "CHANGELOG.md").read_text().splitlines()
    releases = [i for i, line in enumerate(changelog) if line.startswith("## [")]
    end = releases[1] if len(releases) > 1 else len(changelog)
    for number in range(releases[0] if releases else 0, end):
        yield pathlib.Path("CHANGELOG.md"), number + 1, changelog[number], True


def problems():
    packages, features = workspace()
    for name, number, line, history in texts():
        if history and HISTORY.search(line):
            continue
        where = f"{name}:{number}"
        for token in re.findall(r"`([^`\s]+)`", line):
            path = re.sub(r"(:\d+(-\d+)?|#.*)$", "", token)
            if (
                not path.startswith(FOLDERS)
                or path.startswith(GENERATED)
                or any(c in path for c in "*{}<>")
                or "..." in path
            ):
                continue
            if not (ROOT / path).exists():
                yield f"{where}: no such path: {path}"
        for feature in re.findall(r"feature `([A-Za-z0-9_-]+)`", line):
            if feature not in features:
                yield f"{where}: no such feature: {feature}"
        for group in re.findall(r"--features[ =]([A-Za-z0-9_,-]+)", line):
            for feature in group.split(","):
                if feature and feature not in features:
                    yield f"{where}: no such feature: {feature}"
        for group in re.findall(r"features = \[([^\]]*)\]", line):
            for feature in re.findall(r'"([^"]+)"', group):
                if feature not in features:
                    yield f"{where}: no such feature: {feature}"
        for example in re.findall(r"--example ([A-Za-z0-9_-]+)", line):
            if not (ROOT / "examples" / f"{example}.rs").exists():
                yield f"{where}: no such example: {example}"
        for bench in re.findall(r"--bench ([A-Za-z0-9_-]+)", line):
            if not (ROOT / "benches" / f"{bench}.rs").exists():
                yield f"{where}: no such bench: {bench}"
        for package in re.findall(r"(?:-p |the crate `)(idempotent-retry[A-Za-z0-9_-]*)", line):
            if package not in packages:
                yield f"{where}: no such package: {package}"


def main():
    found = list(problems())
    for problem in found:
        print(problem)
    if found:
        print(f"{len(found)} stale names: fix the text, or the name it points at", file=sys.stderr)
        return 1
    print("every path, feature, example, bench and package the docs name exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
