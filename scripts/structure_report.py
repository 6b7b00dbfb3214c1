"""Print the repository's structure figures and check its layout rules (docs/guide.md, "Layout").

Figures: modules per folder, the deepest import chain per package, the largest modules, how many places define each
fact that must have one home. Rules (``--check`` exits 1 naming every breach; the unit tests run it): no import
cycle between modules, nor between subsystem folders; layering ``lacuna_tasks`` <- ``lacuna_metrics`` <-
``lacuna_unlearn``, with ``lacuna_unlearn.bench`` on top of the rest of ``lacuna_unlearn``; cross-package imports
(and those of ``benchmarks/``) only through a package's public face (its ``__init__``); no family of 3 or more
modules sharing a name prefix at a package root; no two modules of one folder whose names differ by a plural ``s``.
``python scripts/structure_report.py [--json] [--check] [--root DIR]``."""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("lacuna_tasks", "lacuna_metrics", "lacuna_unlearn")
#: the top of lacuna_unlearn: nothing else in the package may import it
TOP = "lacuna_unlearn.bench"
#: what imports the packages from outside them, and so must use the faces too
CLIENT_DIRS = ("benchmarks",)
CLIENT_FILES = ("_lacuna_lmeval_hook.py",)

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
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if "data" not in p.relative_to(ROOT).parts)


def face_exports() -> dict[str, str]:
    """``package.name`` -> the module defining it, for every name a package's face exports (read from its
    ``_EXPORTS`` table without importing it)."""
    out: dict[str, str] = {}
    for pkg in PACKAGES:
        init = ROOT / pkg / "__init__.py"
        for node in ast.walk(ast.parse(init.read_text())):
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if isinstance(key, ast.Constant) and isinstance(value, ast.Tuple):
                        for elt in value.elts:
                            if isinstance(elt, ast.Constant):
                                out[f"{pkg}.{elt.value}"] = key.value
    return out


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> our modules it imports (at any depth: module level or inside a function)."""
    names = {module_name(p) for p in modules()}
    faces = face_exports()
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
                t = faces.get(t, t)  # a name of a package's face counts as an import of its module
                if t in names and t != me and t not in PACKAGES:  # the faces themselves import nothing
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


def top_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports of ``lacuna_unlearn.bench`` from the rest of ``lacuna_unlearn`` (bench sits on top of it)."""
    inside = lambda m: m == TOP or m.startswith(TOP + ".") or m.endswith(".__main__")  # noqa: E731  (entry points)
    return sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps if inside(d) and not inside(m))


def _node(module: str, depth: int) -> str:
    """The folder ``module`` lies in at ``depth`` dotted parts (``lacuna_metrics.localization``), or the module
    itself when it lies higher (a root module such as ``lacuna_metrics.score`` is its own node)."""
    parts = module.split(".")
    if len(parts) > depth and (ROOT.joinpath(*parts[:depth]) / "__init__.py").is_file():
        return ".".join(parts[:depth])
    return module


def folder_cycles(graph: dict[str, set[str]]) -> dict[int, list[list[str]]]:
    """Import loops between subsystem folders: the module graph collapsed to the folders ``depth`` parts deep
    (2: ``lacuna_metrics.frag``; 3: ``lacuna_unlearn.bench.gate``), for each depth that has folders."""
    out: dict[int, list[list[str]]] = {}
    for depth in (2, 3):
        folded: dict[str, set[str]] = {}
        for m, deps in graph.items():
            a = _node(m, depth)
            folded.setdefault(a, set()).update(b for d in deps if (b := _node(d, depth)) != a)
        out[depth] = cycles(folded)
    return out


def deep_cross_imports() -> list[str]:
    """Imports of another package's submodule (``from lacuna_metrics.score import x``) by a package or a client
    (``benchmarks/``, the lm-eval hook): every one must name the package's face instead."""
    files = [
        *modules(),
        *(p for d in CLIENT_DIRS for p in sorted((ROOT / d).glob("*.py"))),
        *(ROOT / f for f in CLIENT_FILES),
    ]
    found = []
    for path in files:
        rel = path.relative_to(ROOT)
        mine = rel.parts[0] if rel.parts[0] in PACKAGES else None
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            mods = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                mods = [node.module]
            elif isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            for mod in mods:
                top = mod.split(".")[0]
                if top in PACKAGES and top != mine and mod != top:
                    found.append(f"{rel}:{node.lineno} {mod}")
    return found


def _root_modules(pkg: str) -> list[str]:
    """The modules and subsystem folders at a package's root (``__init__``/``__main__`` aside)."""
    root = ROOT / pkg
    files = [p.stem for p in root.glob("*.py") if p.stem not in ("__init__", "__main__")]
    return sorted(files + [p.name for p in root.iterdir() if (p / "__init__.py").is_file()])


def prefix_families(minimum: int = 3) -> dict[str, list[str]]:
    """``pkg/prefix_`` -> the root modules of ``pkg`` whose names start with ``prefix_`` (or are ``prefix``), for
    prefixes shared by at least ``minimum`` of them: a family that wants to be a folder."""
    out: dict[str, list[str]] = {}
    for pkg in PACKAGES:
        names = [n for n in _root_modules(pkg) if (ROOT / pkg / f"{n}.py").is_file()]
        groups: dict[str, list[str]] = {}
        for n in names:
            groups.setdefault(n.split("_")[0].removesuffix("s"), []).append(n)
        out.update({f"{pkg}/{k}_*": v for k, v in sorted(groups.items()) if len(v) >= minimum})
    return out


def plural_twins() -> list[str]:
    """Pairs of modules in one folder whose names differ by a final ``s`` (``score.py`` / ``scores.py``)."""
    found = []
    for pkg in PACKAGES:
        for folder in [ROOT / pkg, *(p.parent for p in (ROOT / pkg).rglob("__init__.py"))]:
            stems = {p.stem for p in folder.glob("*.py")} | {p.name for p in folder.iterdir() if p.is_dir()}
            found += [f"{folder.relative_to(ROOT)}/{n}, {n}s" for n in sorted(stems) if f"{n}s" in stems]
    return sorted(set(found))


def modules_per_folder() -> dict[str, int]:
    counts: dict[str, int] = {}
    for path in modules():
        if path.name != "__init__.py":
            key = str(path.parent.relative_to(ROOT))
            counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def deepest_chains(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Per package, the longest chain of imports among its own modules (``a`` imports ``b`` imports ...)."""
    out: dict[str, list[str]] = {}
    for pkg in PACKAGES:
        inside = {m: {d for d in deps if d.split(".")[0] == pkg} for m, deps in graph.items() if m.split(".")[0] == pkg}
        out[pkg] = max((_longest(m, inside, {}) for m in sorted(inside)), key=len, default=[])
    return out


def _longest(m: str, graph: dict[str, set[str]], memo: dict[str, list[str]]) -> list[str]:
    """The longest import chain from ``m`` in an acyclic ``graph`` (memoised)."""
    if m not in memo:
        memo[m] = [m]  # a cycle (reported elsewhere) stops here
        memo[m] = [m, *max((_longest(d, graph, memo) for d in sorted(graph.get(m, ()))), key=len, default=[])]
    return memo[m]


def breaches(graph: dict[str, set[str]]) -> list[str]:
    """Every breach of the layout rules, one line each (empty: the layout holds)."""
    out = [f"import cycle: {' <-> '.join(c)}" for c in cycles(graph)]
    out += [f"folder cycle (depth {k}): {' <-> '.join(c)}" for k, cs in folder_cycles(graph).items() for c in cs]
    out += [f"layering: {v}" for v in layering_violations(graph)]
    out += [f"bench on top: {v}" for v in top_violations(graph)]
    out += [f"deep cross-package import: {v}" for v in deep_cross_imports()]
    out += [f"prefix family at a package root: {k}: {', '.join(v)}" for k, v in prefix_families().items()]
    out += [f"plural twins: {v}" for v in plural_twins()]
    return out


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
    global ROOT
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--check", action="store_true", help="exit 1 when a layout rule is broken")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--root", type=Path, default=ROOT, help="the repository to read (default: this one)")
    args = ap.parse_args()
    ROOT = args.root.resolve()
    sizes = sorted(((len(p.read_text().splitlines()), str(p.relative_to(ROOT))) for p in modules()), reverse=True)
    graph = import_graph()
    chains = deepest_chains(graph)
    report = {
        "modules": len(sizes),
        "lines": sum(n for n, _ in sizes),
        "modules_per_folder": modules_per_folder(),
        "deepest_chain": {pkg: {"length": len(c), "chain": c} for pkg, c in chains.items()},
        "prefix_families": prefix_families(),
        "deep_cross_imports": deep_cross_imports(),
        "over_600": [f"{f} {n}" for n, f in sizes if n > 600],
        "largest": [f"{f} {n}" for n, f in sizes[: args.top]],
        "import_edges": sum(len(d) for d in graph.values()),
        "cycles": cycles(graph),
        "folder_cycles": folder_cycles(graph),
        "layering_violations": layering_violations(graph),
        "top_violations": top_violations(graph),
        "plural_twins": plural_twins(),
        "facts": {k: len({site.split(":")[0] for site in v}) for k, v in facts().items()},
        "fact_sites": facts(),
        "breaches": breaches(graph),
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print(report)
    if args.check and report["breaches"]:
        print(f"{len(report['breaches'])} layout breaches:", file=sys.stderr)
        for line in report["breaches"]:
            print(f"  {line}", file=sys.stderr)
        sys.exit(1)


def _print(report: dict) -> None:
    print(f"{report['modules']} modules, {report['lines']} lines, {report['import_edges']} import edges")
    print("modules per folder:")
    for folder, n in report["modules_per_folder"].items():
        print(f"  {n:3d}  {folder}/")
    print("deepest import chain per package:")
    for pkg, c in report["deepest_chain"].items():
        print(f"  {pkg}: {c['length']} modules: {' -> '.join(c['chain'])}")
    fams = report["prefix_families"]
    print(f"prefix families of 3+ at a package root: {len(fams)}")
    for k, v in fams.items():
        print(f"  {k}: {len(v)} ({', '.join(v)})")
    print(f"deep cross-package imports: {len(report['deep_cross_imports'])}")
    print("largest modules:")
    for line in report["largest"]:
        print(f"  {line}")
    print(f"modules over 600 lines: {len(report['over_600'])}")
    print(f"import cycles: {report['cycles'] or 'none'}")
    print(f"folder cycles: {({k: v for k, v in report['folder_cycles'].items() if v}) or 'none'}")
    print(f"layering violations (tasks <- metrics <- unlearn): {report['layering_violations'] or 'none'}")
    print(f"bench on top of lacuna_unlearn: {report['top_violations'] or 'none'}")
    print(f"plural twins: {report['plural_twins'] or 'none'}")
    print("files defining each fact:")
    for fact, sites in report["fact_sites"].items():
        files = sorted({site.split(":")[0] for site in sites})
        print(f"  {len(files):2d}  {fact}: {', '.join(files)}")
    print(f"layout breaches: {len(report['breaches'])}")


if __name__ == "__main__":
    main()
