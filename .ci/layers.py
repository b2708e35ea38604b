#!/usr/bin/env python3
"""Checks that src/ modules depend on each other one way only, in src/lib.rs's order.

Reads every `crate::<module>` path in non-test code (a file's `#[cfg(test)]` tail and
`tests.rs` files are skipped), builds the graph between top-level modules, and fails on a
cycle or on an import into `router/` of a module that does I/O.
"""
import pathlib, re, sys

src = pathlib.Path(__file__).resolve().parent.parent / "src"
# Modules that may do I/O (database, network, files, clock-driven caches): router/ must not
# use any of them.
IO = {"db", "store", "settings", "conversations", "state", "service", "server", "cli",
      "telemetry", "guard", "codec", "client", "config", "eval"}

def top(path: pathlib.Path) -> str:
    rel = path.relative_to(src)
    return rel.parts[0].removesuffix(".rs")

edges: dict[str, set[str]] = {}
for f in src.rglob("*.rs"):
    if f.name == "tests.rs" or f.name in ("lib.rs", "main.rs"):
        continue
    text = f.read_text()
    cut = text.find("#[cfg(test)]\nmod tests")
    if cut >= 0:
        text = text[:cut]
    text = re.sub(r"//.*", "", text)
    m = top(f)
    deps = set()
    for used in re.findall(r"crate::(\w+)", text):
        deps.add(used)
    # `use crate::{a, b::c}` groups
    for group in re.findall(r"crate::\{([^}]*)\}", text):
        deps.update(re.findall(r"(?:^|,)\s*(\w+)", group))
    deps.discard(m)
    deps.discard("proto")
    deps = {d for d in deps if (src / f"{d}.rs").exists() or (src / d).is_dir()}
    edges.setdefault(m, set()).update(deps)

failed = False
# The module map in src/lib.rs is in data-flow order: each module uses only those above it.
order = re.findall(r"^pub(?:\(crate\))? mod (\w+);", (src / "lib.rs").read_text(), re.M)
place = {m: i for i, m in enumerate(order)}
for m in sorted(edges):
    for d in sorted(edges[m]):
        if m in place and d in place and place[d] > place[m]:
            print(f"{m} uses `{d}`, which src/lib.rs lists below it")
            failed = True
for bad in sorted(edges.get("router", set()) & IO):
    print(f"router/ uses `{bad}`, which does I/O")
    failed = True

# Cycles: Tarjan's strongly connected components.
index, low, stack, on, sccs = {}, {}, [], set(), []
def visit(v, counter=[0]):
    index[v] = low[v] = counter[0]; counter[0] += 1
    stack.append(v); on.add(v)
    for w in edges.get(v, ()):
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: sccs.append(sorted(comp))
for v in sorted(edges):
    if v not in index: visit(v)
for comp in sccs:
    print("import cycle among:", ", ".join(comp))
    for a in comp:
        print(f"  {a} -> {', '.join(sorted(edges[a] & set(comp)))}")
    failed = True
if "-v" in sys.argv:
    for m in sorted(edges):
        print(f"{m} -> {', '.join(sorted(edges[m]))}")
sys.exit(1 if failed else 0)
