"""Fail when modules of the package import each other in a cycle, lazily or not (imports under
``TYPE_CHECKING`` aside): ``python tools/import_cycles.py``."""

from __future__ import annotations

import sys

import grimp


def cycles(package: str = "tilefeed") -> list[list[str]]:
    """The groups of modules that reach each other through imports (strongly connected, two or
    more modules), each sorted."""
    graph = grimp.build_graph(package, exclude_type_checking_imports=True)
    modules = sorted(graph.modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:  # Tarjan's algorithm, iterative: no recursion limit to meet
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges[child])))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))

    for module in modules:
        if module not in index:
            visit(module)
    return found


def main() -> int:
    found = cycles()
    for group in found:
        print("import cycle: " + " <-> ".join(group))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
