"""The package's import graph: no module imports itself back through others (the layers
contract that imports point down is import-linter's, in pyproject.toml, run by .ci/run)."""

from __future__ import annotations

import grimp


def _cycles(graph) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan, iteratively)."""
    adjacency = {m: sorted(i for i in graph.find_modules_directly_imported_by(m) if i.startswith("convprobe"))
                 for m in sorted(graph.modules)}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []
    for root in adjacency:
        if root in index:
            continue
        work = [(root, iter(adjacency[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(adjacency[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
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
                    groups.append(sorted(group))
    return groups


def test_the_cycle_finder_finds_a_cycle():
    class Graph:
        modules = {"convprobe.a", "convprobe.b", "convprobe.c"}

        @staticmethod
        def find_modules_directly_imported_by(module):
            return {"convprobe.a": {"convprobe.b"}, "convprobe.b": {"convprobe.a"}, "convprobe.c": {"convprobe.a"}}[module]

    assert _cycles(Graph) == [["convprobe.a", "convprobe.b"]]


def test_no_module_imports_itself_back():
    assert _cycles(grimp.build_graph("convprobe")) == []
