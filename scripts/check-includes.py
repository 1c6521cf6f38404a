#!/usr/bin/env python3
"""Checks the daemon's include graph: its folders form no cycle, and nothing in daemon/ includes
the clients' code.

Every `#include "..."` line of daemon/**/*.{h,cc,cu,cuh} is read. A file directly in daemon/
(main.cc, server.cc, config.h, ...) is a node of its own; a file deeper down belongs to the node of
its first folder (daemon/comm/p2p.cc -> comm). An include of another node is an edge. The check
fails when:
  - the folder graph has a cycle (the cycle is printed with one include line per edge), or
  - a file in daemon/ includes anything under client/ or tests/ (by path, or by a name that
    resolves to the C++ client's public include directory, such as "railyard/client.h").
    Types both sides need live in common/ (and wire facts in proto/railyard/v1), which both may
    include.

  scripts/check-includes.py [--root DIR]    exit 0 when clean, 1 with what is wrong
  scripts/check-includes.py --self-test     shows that a cycle and a client include are caught
"""
import argparse
import os
import re
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
SOURCES = (".h", ".cc", ".cu", ".cuh")
# The C++ client's public headers, reached by bare names ("railyard/client.h").
CLIENT_PUBLIC_INCLUDE = os.path.join("client", "cpp", "include")


def node_of(path_in_daemon):
    """daemon/comm/x.cc -> 'comm'; daemon/server.cc -> '/server.cc'."""
    parts = path_in_daemon.split("/")
    return parts[1] if len(parts) > 2 else "/" + parts[1]


def scan(root):
    """(edges, crossings): edges[a][b] = ['file:line -> include', ...]."""
    edges = {}
    crossings = []
    daemon = os.path.join(root, "daemon")
    for dirpath, _, files in os.walk(daemon):
        for name in sorted(files):
            if not name.endswith(SOURCES):
                continue
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            src = node_of(rel)
            with open(full, encoding="utf-8", errors="replace") as f:
                for lineno, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    inc = m.group(1)
                    where = f"{rel}:{lineno} includes \"{inc}\""
                    first = inc.split("/")[0]
                    if first in ("client", "tests"):
                        crossings.append(where)
                        continue
                    if os.path.exists(os.path.join(root, CLIENT_PUBLIC_INCLUDE, inc)):
                        crossings.append(where + f" ({CLIENT_PUBLIC_INCLUDE}/{inc})")
                        continue
                    if first != "daemon" or inc.count("/") < 1:
                        continue
                    dst = node_of(inc)
                    if dst != src:
                        edges.setdefault(src, {}).setdefault(dst, []).append(where)
    return edges, crossings


def find_cycles(edges):
    """Each elementary cycle found by a depth-first search, once (as a list of nodes)."""
    cycles, seen = [], set()
    state = {}  # node -> 1 on the stack, 2 done
    stack = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, {})):
            if state.get(m) == 1:
                cycle = stack[stack.index(m):]
                key = frozenset(cycle)
                if key not in seen:
                    seen.add(key)
                    cycles.append(cycle)
            elif state.get(m) is None:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(edges):
        if state.get(n) is None:
            visit(n)
    return cycles


def check(root):
    edges, crossings = scan(root)
    problems = []
    for cycle in find_cycles(edges):
        lines = [f"cycle between daemon folders: {' -> '.join(cycle + [cycle[0]])}"]
        for a, b in zip(cycle, cycle[1:] + [cycle[0]]):
            lines.append(f"    {edges[a][b][0]}")
        problems.append("\n".join(lines))
    for c in crossings:
        problems.append(f"daemon/ includes the clients' code: {c}; put what both need in "
                        "common/ (or proto/railyard/v1 for wire facts)")
    return problems


def self_test():
    """A tree with a cycle and a client include must fail; the same tree without them passes."""
    with tempfile.TemporaryDirectory() as root:
        def write(rel, text):
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        write("client/cpp/include/railyard/client.h", "")
        write("daemon/a/x.h", '#include "daemon/b/y.h"\n')
        write("daemon/b/y.h", '#include "daemon/c/z.h"\n')
        write("daemon/c/z.h", "")
        write("daemon/main.cc", '#include "daemon/a/x.h"\n')
        assert check(root) == [], check(root)
        write("daemon/c/z.h", '#include "daemon/a/x.h"\n')  # a -> b -> c -> a
        got = check(root)
        assert len(got) == 1 and "a -> b -> c -> a" in got[0], got
        write("daemon/c/z.h", '#include "railyard/client.h"\n')
        got = check(root)
        assert len(got) == 1 and "clients' code" in got[0], got
        write("daemon/c/z.h", '#include "client/cpp/client_core.h"\n')
        got = check(root)
        assert len(got) == 1 and "client_core.h" in got[0], got
    print("check-includes self-test: a cycle and both kinds of client include are caught")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    problems = check(os.path.abspath(args.root))
    for p in problems:
        print(p)
    if problems:
        print(f"check-includes: {len(problems)} problem(s)")
        return 1
    edges, _ = scan(os.path.abspath(args.root))
    print(f"check-includes: {sum(len(v) for v in edges.values())} folder edges in daemon/, "
          "no cycle, no include of client/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
