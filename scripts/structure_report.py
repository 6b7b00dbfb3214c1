"""Print the repository's structure figures (issue 21): largest modules, the import graph's cycles, and how many
places define each fact that must have one home. ``python scripts/structure_report.py [--json]``."""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("lacuna_tasks", "lacuna_metrics", "lacuna_unlearn")

#: fact -> regex over the packages' source whose matches are definitions of that fact.
FACTS: dict[str, str] = {
    "task/metric table (metric -> lm-eval task, metric)": r'^\s*"[a-z_]+": \("(?:forget|retain)_[a-z_]+", "[a-z_]+"\)'
    r"|^\s*\(\"(?:forget|retain)_[a-z_]+\", \"[a-z_]+\", \"[a-z_]+\"\)|^\s*\"[a-z_]+\": MetricSpec\(",
    "schema name literal": r'"lacuna-bench/(?:run|score|gate|attack|diagnose)"',
    "manifest package list": r"package_versions\(\(|^[A-Z_]*PACKAGES\s*=\s*\(",
    "QA dataset class": r"^class \w*QADataset\b",
    "task YAML directory lookup": r"[\"/]task_yamls\b",
    "field key list literal": r"[\[(]\s*\"email\",\s*\"phone\"",
    "preset choice list literal": r"choices=\[\"(?:smoke|mini)\"",
    "lm-eval results file search": r'rglob\(\s*"results|^RESULTS_GLOB\s*=',
    "lm-eval metric-filter rule (',none' keys)": r'",none"|\},none"|\{NO_FILTER\}',
    "run/testbed preset definitions": r"^(?:PRESETS|DEFAULT_RUN)\s*(?::[^=]*)?=\s*[\[{(]",
    "null-update scoring loop": r"^\s*for kind in NULL_KINDS:",
    "block walk over a checkpoint pair": r"^def (?:_walk_pairs|prefetched|walk_pair)\b|^class PairWalk\b|tqdm\(shared",
    "method registry": r"^(?:METHODS|EDITORS|_METHODS|_EDITORS|REGISTRY)\s*[:=]",
}


def modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> our modules it imports (at any depth: module level or inside a function)."""
    names = {module_name(p) for p in modules()}
    graph: dict[str, set[str]] = {}
    for path in modules():
        me = module_name(path)
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level:
                base = me.split(".")[: -node.level] if path.name != "__init__.py" else me.split(".")[: 1 - node.level]
                mod = ".".join(base + ([node.module] if node.module else []))
                targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
            for t in targets:
                if t in names and t != me:
                    deps.add(t)
        graph[me] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), i.e. import loops."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            # a package's __init__ importing its own submodules is not a loop
            if v.startswith(w + ".") or w.startswith(v + "."):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    rank = {pkg: i for i, pkg in enumerate(PACKAGES)}
    return sorted(
        f"{m} -> {d}" for m, deps in graph.items() for d in deps if rank[d.split(".")[0]] > rank[m.split(".")[0]]
    )


def facts() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for fact, pattern in FACTS.items():
        rx = re.compile(pattern, re.M)
        hits = []
        for path in [*modules(), ROOT / "_lacuna_lmeval_hook.py"]:
            text = path.read_text()
            for m in rx.finditer(text):
                hits.append(f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}")
        found[fact] = hits
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    sizes = sorted(((len(p.read_text().splitlines()), str(p.relative_to(ROOT))) for p in modules()), reverse=True)
    graph = import_graph()
    report = {
        "modules": len(sizes),
        "lines": sum(n for n, _ in sizes),
        "over_600": [f"{f} {n}" for n, f in sizes if n > 600],
        "largest": [f"{f} {n}" for n, f in sizes[: args.top]],
        "import_edges": sum(len(d) for d in graph.values()),
        "cycles": cycles(graph),
        "layering_violations": layering_violations(graph),
        "facts": {k: len({site.split(":")[0] for site in v}) for k, v in facts().items()},
        "fact_sites": facts(),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{report['modules']} modules, {report['lines']} lines, {report['import_edges']} import edges")
    print("largest modules:")
    for line in report["largest"]:
        print(f"  {line}")
    print(f"modules over 600 lines: {len(report['over_600'])}")
    print(f"import cycles: {report['cycles'] or 'none'}")
    print(f"layering violations (tasks <- metrics <- unlearn): {report['layering_violations'] or 'none'}")
    print("files defining each fact:")
    for fact, sites in report["fact_sites"].items():
        files = sorted({site.split(":")[0] for site in sites})
        print(f"  {len(files):2d}  {fact}: {', '.join(files)}")


if __name__ == "__main__":
    main()
