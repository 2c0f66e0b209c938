#!/usr/bin/env python3
"""Module import graph of the crate, and the import circles in it.

Each file under src/ is one module: src/lib.rs is `crate`, src/a.rs and
src/a/mod.rs are `crate::a`, src/a/b.rs is `crate::a::b`; inline `mod x { .. }`
blocks belong to their file. An arrow A -> B means file A names something in
module B, through `use crate::..` / `use super::..` / `use self::..` /
`use child::..` (grouped forms over several lines included) or through a path
in code such as `crate::redirect::follow(..)`. A path lands on its longest
prefix that is a module file (`crate::engine::Settings` -> crate::engine), and
a name re-exported by `pub use` / `pub(crate) use` in lib.rs or a mod.rs is
followed to the module it comes from (`crate::Client` -> crate::client,
`crate::ledger::MemoryLedger` -> crate::ledger::memory).

Ignored: comments, string and char literals, everything under `#[cfg(test)]`
(including files declared `#[cfg(test)] mod x;`), `mod x;` declarations, other
crates, and a file naming itself. Arrows from a module to its own descendants
(a parent re-exporting its children) are structural: shown by --edges and
--dot, left out of the circle check. Arrows from a child up to an ancestor
(`use super::Ledger` in ledger/session.rs) are ordinary arrows. Code behind
`#[cfg(feature = ..)]` counts as if every feature were on. Glob re-exports
(`pub use x::*`) are not followed.

A circle is a strongly connected component of more than one file. The count
line `N circles among M modules, E arrows` counts every module file (M) and
every non-structural arrow, one per ordered pair of files (E).

Layers: when a folder directly under src/ says in its mod.rs docs which folders it may import
(a line `//! May import: a, b.` or `//! May import: nothing.`), every folder there must say it,
and an arrow from a file in one folder (subfolders included) to a file in another must name a
folder on that list; no folder may import a file directly under src/ (lib.rs, a front end
beside the folders), and the lists themselves must not form a circle. A violation exits 1.

Run from the repository root: `python3 scripts/module_graph.py` prints the
circles and the count line; `--edges` every arrow `from -> to: names`;
`--dot` Graphviz (circle arrows red, count line on stderr); `--root DIR`
analyses DIR/src instead; `--self-test` checks the rules on a synthetic tree. Exit status: 1 when there
is at least one circle, 0 otherwise.
"""
import argparse
import re
import sys
import tempfile
from pathlib import Path

IDENT = r"[A-Za-z_]\w*"
USE = re.compile(r"(?<![\w:$])(pub\s*(?:\([^)]*\))?\s*)?use\s+([^;]*);")
PATH = re.compile(rf"(?<![\w:$])(\$?{IDENT}(?:\s*::\s*{IDENT})+)")
INLINE_MOD = re.compile(rf"(?<![\w:])mod\s+({IDENT})\s*\{{")
TEST_CFG = re.compile(r"#\s*\[\s*cfg\s*\(\s*(?:all\s*\(\s*)?test\b[^\]]*\]")
LITERAL = re.compile("|".join([  # literals and comments, leftmost first
    r'(?<!\w)[bc]?r(#*)"[\s\S]*?"\1',  # raw strings r#".."#
    r'(?:(?<!\w)[bc])?"(?:\\[\s\S]|[^"\\])*"',  # strings
    r"'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F_]*\}|.)|[^\\'\n])'",  # chars, not lifetimes
    r"//[^\n]*", r"/\*"]))


def blank(s):
    return re.sub(r"[^\n]", " ", s)


def strip(src):
    """Replace comments and string/char literals with spaces (lines kept)."""
    out, i = [], 0
    while m := LITERAL.search(src, i):
        j = m.end()
        if m[0] == "/*":  # block comments nest
            depth = 1
            while depth and (k := re.compile(r"/\*|\*/").search(src, j)):
                depth, j = depth + (1 if k[0] == "/*" else -1), k.end()
            j = len(src) if depth else j
        out += [src[i:m.start()], blank(src[m.start():j])]
        i = j
    return "".join(out) + src[i:]


def close(t, i, pair="{}"):
    """Index just after the bracket matching the opening one at t[i]."""
    depth = 0
    for j in range(i, len(t)):
        depth += (t[j] == pair[0]) - (t[j] == pair[1])
        if depth == 0:
            return j + 1
    return len(t)


def drop_test_items(t):
    """Blank every item under `#[cfg(test)]` (tracked by brace depth); also
    return the names of the `#[cfg(test)] mod x;` files it declares."""
    test_mods = []
    while m := TEST_CFG.search(t):
        j = m.end()
        while a := re.compile(r"\s*#\s*\[").match(t, j):  # further attributes
            j = close(t, a.end() - 1, "[]")
        item = re.compile(rf"\s*(?:pub\s*(?:\([^)]*\))?\s*)?(?:(use)\b|mod\s+({IDENT})\s*;)").match(t, j)
        if item and item[1]:  # `use a::{..};` ends at its semicolon
            j = (t.find(";", j) + 1) or len(t)
        else:  # other items end at a `;` or after their `{ .. }` body
            depth = 0
            while j < len(t) and (depth or t[j] not in ";{"):
                depth += (t[j] in "([") - (t[j] in ")]")
                j += 1
            j = close(t, j) if j < len(t) and t[j] == "{" else j + 1
        test_mods += [item[2]] if item and item[2] else []
        t = t[:m.start()] + blank(t[m.start():j]) + t[j:]
    return t, test_mods


def parse_use(tree):
    """`a::{b, c::{self, D as E}}` -> [(['a','b'], 'b'), (['a','c'], 'c'), (['a','c','D'], 'E')]."""
    toks = re.findall(rf"::|[{{}},*]|\$?{IDENT}", tree)
    out = []

    def walk(i, path):
        while i < len(toks) and toks[i] not in ",}":
            t, i = toks[i], i + 1
            if t == "{":
                while i < len(toks) and toks[i] != "}":
                    i = walk(i, path)
                    i += i < len(toks) and toks[i] == ","
                return i + 1
            if t == "*":
                out.append((path + ["*"], "*"))
                return i
            if t != "::":
                path = path + [t]
            if toks[i:i + 1] == ["as"] and i + 1 < len(toks):
                out.append((path[:-1] if t == "self" else path, toks[i + 1]))
                return i + 2
        path = path[:-1] if path[-1:] == ["self"] else path
        if path:
            out.append((path, path[-1]))
        return i

    if toks and toks[0] != "::":  # `use ::other_crate::..` is not ours
        walk(0, [])
    return out


class Crate:
    def __init__(self, root):
        src = Path(root) / "src"
        self.files, self.text, self.spans, test_only = {}, {}, {}, set()
        for f in sorted(src.rglob("*.rs")):
            rel = f.relative_to(src)
            # A binary's main.rs is its crate root when there is no library beside it.
            if rel.parts[0] == "bin" or (rel.as_posix() == "main.rs" and (src / "lib.rs").exists()):
                continue
            parts = list(rel.with_suffix("").parts)
            root_names = ("lib", "mod", "main") if len(parts) == 1 else ("lib", "mod")
            mod = ("crate", *parts[:-1]) + (() if parts[-1] in root_names else (parts[-1],))
            self.files[mod] = f"src/{rel.as_posix()}"
            t, tests = drop_test_items(strip(f.read_text(encoding="utf-8")))
            test_only |= {mod + (name,) for name in tests}
            self.text[mod] = re.sub(r"pub\s*\(\s*in\b[^)]*\)", lambda m: blank(m[0]), t)
            self.spans[mod] = [(m.start(), close(t, m.end() - 1), m[1]) for m in INLINE_MOD.finditer(t)]
        for mod in self.text:  # files declared `#[cfg(test)] mod x;` are test code
            if any(mod[:k] in test_only for k in range(2, len(mod) + 1)):
                self.text[mod] = ""
        self.known = set(self.files) | {self.base(m, s) + (name,)
                                         for m, spans in self.spans.items() for s, _, name in spans}
        self.reexp = {}  # module -> {re-exported name: absolute path it comes from}
        for mod, t in self.text.items():
            for m in (m for m in USE.finditer(t) if m[1]):
                base = self.base(mod, m.start())
                for segs, alias in parse_use(m[2]):
                    if alias != "*" and (path := self.absolute(segs, base)) is not None:
                        self.reexp.setdefault(base, {})[alias] = path

    def base(self, mod, pos):
        """Module in force at `pos` of `mod`'s file (inline `mod x {}` included)."""
        return mod + tuple(name for s, e, name in self.spans[mod] if s < pos < e)

    def absolute(self, segs, base):
        """Absolute path for segs written in module base, or None if not this crate's."""
        segs = [s.strip() for s in segs]
        if segs[0] in ("crate", "$crate"):
            return ("crate", *segs[1:])
        if segs[0] in ("self", "super"):
            while segs and segs[0] in ("self", "super"):
                base = base[:-1] if segs.pop(0) == "super" else base
            return base + tuple(segs) if base else None
        return base + tuple(segs) if base + (segs[0],) in self.known else None

    def resolve(self, path, depth=0):
        """(module file, name) that an absolute path lands in, re-exports followed."""
        k = max(k for k in range(1, len(path) + 1) if path[:k] in self.files)
        mod, rest = path[:k], path[k:]
        if rest and rest[0] != "*" and depth < 16:
            hop = self.reexp.get(mod, {}).get(rest[0])
            if hop is not None and hop != path[:k + 1]:
                return self.resolve(hop + rest[1:], depth + 1)
        return mod, rest[0] if rest else mod[-1]

    def arrows(self):
        """{(from file, to file): set of names}, and the set of structural pairs."""
        edges, structural = {}, set()
        for mod, t in self.text.items():
            refs = [(segs, m.start()) for m in USE.finditer(t) for segs, _ in parse_use(m[2])]
            code = USE.sub(lambda m: blank(m.group()), t)
            refs += [(re.split(r"\s*::\s*", m.group(1)), m.start()) for m in PATH.finditer(code)]
            for segs, pos in refs:
                if (path := self.absolute(segs, self.base(mod, pos))) is None:
                    continue
                target, name = self.resolve(path)
                if target == mod:
                    continue
                pair = (self.files[mod], self.files[target])
                edges.setdefault(pair, set()).add(name)
                if target[:len(mod)] == mod:
                    structural.add(pair)
        return edges, structural


def circles(nodes, edges):
    """Strongly connected components with more than one file, largest first."""
    succ = {n: {b for a, b in edges if a == n} for n in nodes}

    def reach(v):
        seen, todo = set(), [v]
        while todo:
            new = succ[todo.pop()] - seen
            seen |= new
            todo += new
        return seen

    r = {n: reach(n) for n in nodes}
    comps = {tuple(sorted(w for w in r[v] if v in r[w])) for v in nodes if v in r[v]}
    return sorted((list(c) for c in comps if len(c) > 1), key=lambda c: (-len(c), c))


MAY_IMPORT = re.compile(r"^//!\s*May import:\s*(.*?)\.?\s*$", re.M)


def layers(root, plain):
    """The folder rule (see the module docs): (declared lists, violations as text)."""
    src = Path(root) / "src"
    folders = sorted(d.name for d in src.iterdir() if (d / "mod.rs").is_file())
    declared = {}
    for name in folders:
        head = "\n".join(line for line in (src / name / "mod.rs").read_text(encoding="utf-8").splitlines()
                         if line.startswith("//!"))
        if m := MAY_IMPORT.search(head):
            items = [x.strip() for x in m[1].split(",") if x.strip()]
            declared[name] = set() if items == ["nothing"] else set(items)
    if not declared:
        return {}, []
    bad = [f"src/{name}/mod.rs does not say which folders it may import (`//! May import: ...`)"
           for name in folders if name not in declared]
    bad += [f"src/{name}/mod.rs may import `{x}`, which is no folder under src/"
            for name, allowed in declared.items() for x in sorted(allowed) if x not in folders]
    folder = lambda f: f.split("/")[1] if f.count("/") >= 2 else None
    for (a, b), names in sorted(plain.items()):
        fa, fb = folder(a), folder(b)
        if fa is None or fa == fb:
            continue
        if fb is None:
            bad.append(f"{a} -> {b} ({', '.join(sorted(names))}): a folder imports a file beside the folders")
        elif fb not in declared.get(fa, set()):
            bad.append(f"{a} -> {b} ({', '.join(sorted(names))}): src/{fa}/ may not import src/{fb}/")
    arrows = {(a, b) for a, allowed in declared.items() for b in allowed if b in declared}
    bad += [f"the folders' lists form a circle: {', '.join(c)}" for c in circles(declared, arrows)]
    return declared, bad


def analyse(root):
    crate = Crate(root)
    edges, structural = crate.arrows()
    plain = {p: n for p, n in edges.items() if p not in structural}
    return crate, edges, structural, plain, circles(crate.files.values(), plain)


def workspace(root):
    """Each crate's module graph, and the crate graph (normal dependencies between the
    workspace's crates): one count line per crate, the crate arrows, exit 1 on any circle."""
    import json
    import subprocess
    meta = json.loads(subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1"],
        cwd=root, check=True, capture_output=True, text=True).stdout)
    members = {p["name"]: p for p in meta["packages"]}
    arrows = {(name, d["name"]) for name, p in members.items() for d in p["dependencies"]
              if d["name"] in members and d["kind"] is None}
    status = 0
    for name in sorted(members):
        crate_root = Path(members[name]["manifest_path"]).parent
        crate, _, _, plain, comps = analyse(crate_root)
        for k, comp in enumerate(comps, 1):
            print(f"{name}: circle {k} ({len(comp)} modules): {', '.join(comp)}")
        print(f"{name}: {len(comps)} circles among {len(crate.files)} modules, {len(plain)} arrows")
        status |= 1 if comps else 0
        declared, bad = layers(crate_root, plain)
        for line in bad:
            print(f"{name}: layer: {line}")
        if declared:
            print(f"{name}: {len(declared)} folders by layer, {len(bad)} imports against their order")
        status |= 1 if bad else 0
    for a, b in sorted(arrows):
        print(f"crate {a} -> {b}")
    crate_circles = circles(members, arrows)
    for comp in crate_circles:
        print(f"crate circle: {', '.join(comp)}")
    print(f"{len(crate_circles)} circles among {len(members)} crates, {len(arrows)} arrows")
    return 1 if status or crate_circles else status


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=Path(__file__).resolve().parent.parent,
                    help="directory holding src/ (default: this repository)")
    ap.add_argument("--edges", action="store_true", help="print every arrow")
    ap.add_argument("--dot", action="store_true", help="print Graphviz")
    ap.add_argument("--self-test", action="store_true", help="run the built-in cases")
    ap.add_argument("--workspace", action="store_true",
                    help="every crate of the cargo workspace, and the graph of the crates")
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test()
    if args.workspace:
        return workspace(Path(args.root))
    if not (Path(args.root) / "src").is_dir():
        ap.error(f"no src/ under {args.root}")
    crate, edges, structural, plain, comps = analyse(args.root)
    names = lambda p: ", ".join(sorted(edges[p]))
    inside = sorted(p for c in comps for p in plain if p[0] in c and p[1] in c)
    if args.dot:
        print("digraph modules {\n  rankdir=LR;\n  node [shape=box];")
        print("".join(f'  "{f}";\n' for f in sorted(crate.files.values())), end="")
        for p in sorted(edges):
            style = ", color=red" if p in inside else ", style=dashed, color=gray" if p in structural else ""
            print(f'  "{p[0]}" -> "{p[1]}" [label="{names(p)}"{style}];')
        print("}")
    elif args.edges:
        for p in sorted(edges):
            print(f"{p[0]} -> {p[1]}: {names(p)}" + ("  (structural)" if p in structural else ""))
    else:
        for k, comp in enumerate(comps, 1):
            print(f"circle {k} ({len(comp)} modules): {', '.join(comp)}")
            mine = [p for p in inside if p[0] in comp]
            print("".join(f"  {a} -> {b}: {names((a, b))}\n" for a, b in mine), end="")
            if two_way := [f"{a} <-> {b}" for a, b in mine if a < b and (b, a) in plain]:
                print("  two-way: " + "; ".join(two_way))
    print(f"{len(comps)} circles among {len(crate.files)} modules, {len(plain)} arrows",
          file=sys.stderr if args.dot else sys.stdout)
    declared, bad = layers(args.root, plain)
    for line in bad:
        print(f"layer: {line}", file=sys.stderr if args.dot else sys.stdout)
    if declared:
        print(f"{len(declared)} folders by layer, {len(bad)} imports against their order",
              file=sys.stderr if args.dot else sys.stdout)
    return 1 if comps or bad else 0


SYNTHETIC = {  # a <-> b is the one circle; every other file tests one rule
    "lib.rs": "mod a;\nmod b;\nmod c;\nmod d;\nmod grp;\n#[cfg(test)]\nmod e;\npub use a::{Alpha, alpha_fn};\n"
              "pub use d::Delta as Dee;\n#[cfg(test)]\nmod tests {\n    use crate::c::Gamma;\n}\n",
    "a.rs": "use crate::b::Beta;\npub struct Alpha;\npub fn alpha_fn() {}\n",
    "b.rs": "pub struct Beta;\nfn f() { let s = \"{\"; crate::alpha_fn(); }\n",
    "c.rs": "// use crate::a::Alpha;\n/// crate::b::Beta\n/* crate::d::Delta /* nested */ */\n"
            "fn f() -> &'static str { let q = '\"'; r#\"crate::a::X\"# }\n"
            "pub struct Gamma;\n#[cfg(test)]\n#[allow(unused)]\nmod tests {\n"
            "    use crate::grp::Thing;\n    fn g() { if true { crate::grp::Thing; } }\n}\n"
            "fn h() { crate::grp::Inner; crate::Dee; }\n",
    "e.rs": "use crate::a::Alpha;\n",
    "d.rs": "use crate::grp::{self, Thing};\npub struct Delta;\n",
    "grp/mod.rs": "mod inner;\npub use inner::Inner;\npub struct Thing;\n",
    "grp/inner.rs": "use super::Thing;\nuse crate::{b::Beta,\n    a::{self, Alpha}};\npub struct Inner;\n",
}


def self_test():
    def run(files):
        with tempfile.TemporaryDirectory() as tmp:
            for name, text in files.items():
                (Path(tmp) / "src" / name).parent.mkdir(parents=True, exist_ok=True)
                (Path(tmp) / "src" / name).write_text(text)
            _, edges, structural, _, comps = analyse(tmp)
        short = lambda p: f"{p[0][4:]}>{p[1][4:]}"
        return {short(p): ",".join(sorted(n)) for p, n in edges.items()}, set(map(short, structural)), comps

    def run_layers(files):
        with tempfile.TemporaryDirectory() as tmp:
            for name, text in files.items():
                (Path(tmp) / "src" / name).parent.mkdir(parents=True, exist_ok=True)
                (Path(tmp) / "src" / name).write_text(text)
            _, _, _, plain, _ = analyse(tmp)
            return layers(tmp, plain)[1]

    layered = {
        "lib.rs": "mod low;\nmod high;\n",
        "low/mod.rs": "//! The bottom.\n//!\n//! May import: nothing.\npub(crate) mod a;\n",
        "low/a.rs": "pub struct A;\n",
        "high/mod.rs": "//! May import: low.\npub(crate) mod b;\n",
        "high/b.rs": "use crate::low::a::A;\npub struct B;\n",
    }
    up = {**layered, "low/a.rs": "use crate::high::b::B;\npub struct A;\n"}
    undeclared = {**layered, "high/mod.rs": "//! Says nothing.\npub(crate) mod b;\n"}
    e, structural, comps = run(SYNTHETIC)
    e2, _, comps2 = run({**SYNTHETIC, "b.rs": "pub struct Beta;\n"})
    cases = {
        "grouped use over several lines": e.get("grp/inner.rs>b.rs") == "Beta"
        and e.get("grp/inner.rs>a.rs") == "Alpha,a",
        "super:: goes up to the parent mod.rs": e.get("grp/inner.rs>grp/mod.rs") == "Thing",
        "inline path in code": e.get("b.rs>a.rs") == "alpha_fn",
        "cfg(test) items ignored": "lib.rs>c.rs" not in e and "c.rs>grp/mod.rs" not in e
        and "e.rs>a.rs" not in e,
        "comments and strings ignored": "c.rs>b.rs" not in e and "c.rs>a.rs" not in e,
        "re-exports followed (lib.rs, renamed, mod.rs)": e.get("c.rs>d.rs") == "Delta"
        and e.get("c.rs>grp/inner.rs") == "Inner" and e.get("d.rs>grp/mod.rs") == "Thing,grp",
        "a parent naming its children is structural": "grp/mod.rs>grp/inner.rs" in structural
        and "lib.rs>a.rs" in structural,
        "a circle is found": comps == [["src/a.rs", "src/b.rs"]],
        "no circle": comps2 == [] and "a.rs>b.rs" in e2,
        "folders importing down their lists pass": run_layers(layered) == [],
        "an import up the folders' order fails": any("src/low/ may not import src/high/" in v
                                                     for v in run_layers(up)),
        "every folder must say what it may import": any("src/high/mod.rs does not say" in v
                                                        for v in run_layers(undeclared)),
    }
    for case, ok in cases.items():
        print(("ok    " if ok else "FAIL  ") + case)
    failed = [case for case, ok in cases.items() if not ok]
    print("self-test " + ("failed: " + "; ".join(failed) if failed else "passed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
