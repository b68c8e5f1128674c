#!/usr/bin/env python3
"""The house rules, checked from a build: no source file over 1,200 lines, no circle
between files (a.c calls b.c and b.c calls a.c, directly or through others, read from
the objects' symbol tables with nm), no circle between header includes, and no circle
between folders (the arrows cli -> eval -> backend -> methods -> core point one way).

usage: check_house.py SOURCE_DIR BUILD_DIR   (exit 1 and a list of what is wrong)
Test code (tests/) and fetched peers are not part of the house and are not read."""
import os, re, subprocess, sys
from collections import defaultdict

MAX_LINES = 1200
SKIP = ("tests", "build", "python", "results", ".git", "peers", "third_party")

def sources(root):
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, root)
        top = rel.split(os.sep)[0]
        if rel != "." and (top.startswith("build") or top.startswith(".") or top in SKIP):
            dirs[:] = []
            continue
        for f in files:
            if f.endswith((".c", ".h", ".cu", ".cuh")):
                yield os.path.normpath(os.path.join(rel, f))

def sccs(graph):
    """Tarjan's strongly connected components (iterative); returns those of size > 1."""
    index, low, on, stack, out, n = {}, {}, set(), [], [], [0]
    nodes = set(graph) | {v for vs in graph.values() for v in vs}
    for s in sorted(nodes):
        if s in index:
            continue
        work = [(s, iter(sorted(graph.get(s, ()))))]
        index[s] = low[s] = n[0]; n[0] += 1; stack.append(s); on.add(s)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = n[0]; n[0] += 1; stack.append(w); on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop(); on.discard(w); comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out

def object_source(obj, root, build):
    # CMake names objects <build>/<dir>/CMakeFiles/<target>.dir/<file>.o
    rel = os.path.relpath(obj, build)
    m = re.match(r"(.*?)/?CMakeFiles/[^/]+\.dir/(.*)\.o$", rel)
    if not m:
        return None
    src = os.path.normpath(os.path.join(m.group(1), m.group(2)))
    return src if os.path.exists(os.path.join(root, src)) else None

def symbol_graph(root, build):
    defs, uses = {}, defaultdict(set)
    for d, _, files in os.walk(build):
        for f in files:
            if not f.endswith(".o"):
                continue
            src = object_source(os.path.join(d, f), root, build)
            if src is None or src.split(os.sep)[0] in SKIP:
                continue
            out = subprocess.run(["nm", "-P", os.path.join(d, f)], capture_output=True,
                                 text=True).stdout
            for line in out.splitlines():
                p = line.split()
                if len(p) < 2:
                    continue
                name, kind = p[0], p[1]
                if kind == "U":
                    uses[src].add(name)
                elif kind in "TDBRCV" and kind.isupper():
                    defs.setdefault(name, src)
    graph = defaultdict(set)
    for src, names in uses.items():
        for name in names:
            t = defs.get(name)
            if t and t != src:
                graph[src].add(t)
    return graph

def include_graph(root, files):
    graph = defaultdict(set)
    inc = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
    for f in files:
        with open(os.path.join(root, f), errors="replace") as fh:
            text = fh.read()
        for name in inc.findall(text):
            for base in (os.path.dirname(f), ""):
                cand = os.path.normpath(os.path.join(base, name))
                if os.path.exists(os.path.join(root, cand)):
                    graph[f].add(cand)
                    break
    return graph

def folder(path):
    parts = path.split(os.sep)
    return os.sep.join(parts[:-1]) or "."

def main():
    root, build = sys.argv[1], sys.argv[2]
    files = sorted(sources(root))
    bad = []
    for f in files:
        with open(os.path.join(root, f), errors="replace") as fh:
            n = sum(1 for _ in fh)
        if n > MAX_LINES:
            bad.append(f"long file: {f}: {n} lines (at most {MAX_LINES})")
    sym = symbol_graph(root, build)
    incs = include_graph(root, files)
    # a header named after a source file is that file's interface: including it is an arrow
    # to that file (dot_amx.c including dot_bs.h points at dot_bs.c)
    stems = {os.path.splitext(f)[0]: f for f in files if f.endswith((".c", ".cu"))}
    for a, hs in incs.items():
        if not a.endswith((".c", ".cu")):
            continue
        for h in hs:
            b = stems.get(os.path.splitext(h)[0])
            if b and b != a:
                sym[a].add(b)
    for comp in sccs(sym):
        bad.append("circle between files (calls): " + " <-> ".join(comp))
    for comp in sccs(incs):
        bad.append("circle between headers (includes): " + " <-> ".join(comp))
    fold = defaultdict(set)
    for a, bs in sym.items():
        for b in bs:
            if folder(a) != folder(b):
                fold[folder(a)].add(folder(b))
    for comp in sccs(fold):
        bad.append("circle between folders (calls): " + " <-> ".join(comp))
    if not sym:
        bad.append(f"no objects found under {build}: build first")
    for b in bad:
        print(b)
    print(f"check_house: {len(files)} files, {sum(len(v) for v in sym.values())} call edges "
          f"between files, {len(bad)} problem(s)")
    return 1 if bad else 0

if __name__ == "__main__":
    sys.exit(main())
