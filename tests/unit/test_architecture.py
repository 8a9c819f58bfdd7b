"""The floors of ARCHITECTURE.md, held against the code: every import of every library module
(also those inside functions) goes to its own floor or a lower one; no import cycles; the
config imports no torch; backend names and shard styles are compared only inside the backends;
modules and functions stay readable; test helpers stay out of the library."""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# (floor, module prefixes), low to high; the longest matching prefix decides a module's floor.
FLOORS = [
    (0, ["flowrl._version", "flowrl.registry", "flowrl.catalog"]),
    (1, ["flowrl.algos", "flowrl.parallel", "flowrl.rewards", "flowrl.data", "flowrl.models", "flowrl.agents",
         "flowrl.checks"]),
    (2, ["flowrl.config"]),
    (3, ["flowrl.checkpoint", "flowrl.metrics", "flowrl.comm", "flowrl.cluster"]),
    (4, ["flowrl.actors"]),
    (5, ["flowrl.backends"]),
    (6, ["flowrl.roles"]),
    (7, ["flowrl.nodes"]),
    (8, ["flowrl.graphs", "flowrl.tasks"]),  # the tasks warm their models up with the sft family
    (9, ["flowrl.run"]),
    (10, ["flowrl.cli"]),
]
PACKAGE_FACE = "flowrl"  # flowrl/__init__.py: the version only


def _module_files() -> dict[str, Path]:
    """Module name -> file, for flowrl/ and graphs/ (installed as flowrl.graphs)."""
    out = {}
    for base, prefix in ((ROOT / "flowrl", "flowrl"), (ROOT / "graphs", "flowrl.graphs")):
        for path in base.rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([prefix, *parts])] = path
    return out


def floor_of(module: str) -> int | None:
    best = None
    for floor, prefixes in FLOORS:
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and (best is None or len(p) > len(best[1])):
                best = (floor, p)
    return None if best is None else best[0]


@lru_cache(maxsize=1)
def import_graph() -> dict[str, set[str]]:
    """Module -> the flowrl modules it imports (absolute and relative, any nesting)."""
    files = _module_files()
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        is_pkg = path.name == "__init__.py"
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_pkg else 0)]
                    head = ".".join(base + ([node.module] if node.module else []))
                else:
                    head = node.module or ""
                # ``from pkg import sub`` imports the submodule; ``from pkg import name`` the package
                subs = [f"{head}.{a.name}" for a in node.names]
                names = subs + ([head] if any(sub not in files for sub in subs) else [])
            else:
                continue
            for name in names:
                while name and name not in files:
                    name = name.rpartition(".")[0]
                if name and name != module:
                    targets.add(name)
        graph[module] = targets
    return graph


def test_every_library_module_has_a_floor():
    missing = [m for m in import_graph() if m != PACKAGE_FACE and floor_of(m) is None]
    assert not missing, f"modules on no floor of ARCHITECTURE.md: {missing}"


def test_no_import_runs_up_a_floor():
    upward = []
    for module, targets in import_graph().items():
        mine = floor_of(module)
        for t in targets:
            if mine is not None and t != PACKAGE_FACE and floor_of(t) > mine:
                upward.append(f"{module} (floor {mine}) imports {t} (floor {floor_of(t)})")
    assert not upward, "imports from a lower floor to a higher one:\n" + "\n".join(sorted(upward))


def test_no_import_cycles():
    graph = import_graph()
    # Tarjan's strongly connected components, iteratively.
    index, low, stack, on_stack, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(root: str) -> None:
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    scc = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        scc.append(m)
                        if m == node:
                            break
                    if len(scc) > 1:
                        cycles.append(sorted(scc))
            elif child not in index:
                index[child] = low[child] = counter[0]
                counter[0] += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])

    for m in sorted(graph):
        if m not in index:
            visit(m)
    assert not cycles, f"import cycles: {cycles}"



def package_of(module: str) -> str:
    """``flowrl.algos.kl`` -> ``flowrl.algos``; a top-level module (``flowrl.registry``) is its own."""
    return ".".join(module.split(".")[:2])


def test_no_import_cycles_between_packages():
    """A package-level cycle (``agents -> data -> agents`` through one module) is a cycle of the
    floors even when no module-level cycle exists: each edge is listed with a module import behind it."""
    edges: dict[str, dict[str, str]] = {}
    for module, targets in import_graph().items():
        for t in sorted(targets):
            a, b = package_of(module), package_of(t)
            if a != b and PACKAGE_FACE not in (a, b):
                edges.setdefault(a, {}).setdefault(b, f"{module} -> {t}")

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges.get(todo.pop(), {}):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reachable = {p: reach(p) for p in edges}
    cycles = sorted({tuple(sorted(q for q in reachable[p] if p in reachable.get(q, ()))) for p in edges} - {()})
    found = [f"{' <-> '.join(c)}: " + "; ".join(edges[a][b] for a in c for b in c if b in edges.get(a, {}))
             for c in cycles]
    assert not found, "import cycles between packages:\n" + "\n".join(found)

def test_config_and_the_foundation_import_no_torch():
    code = ("import sys\nimport flowrl.algos.registries, flowrl.backends.registry, flowrl.metrics.names\n"
            "from flowrl.config import load_config\n"
            "load_config(None, [])\nload_config(None, ['algorithm.adv_estimator=gae', 'actor.strategy=megatron'])\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'megatron', 'vllm', 'dask', 'distributed'))\n"
            "assert not heavy, heavy\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


BACKEND_NAMES = {"dp", "fsdp", "megatron", "hf", "vllm", "sglang"}
"""Backend names and shard styles (``hf``, ``megatron``, ``vllm``, ``fsdp``)."""
MESH_AXES = {"dp", "tp", "pp", "vpp", "cp", "ep"}


def _compares_backend_name(node: ast.Compare) -> bool:
    """``x == "megatron"``, ``x != "hf"``, ``x in ("dp", "fsdp")``, ``style is "vllm"``: a string
    constant (or a literal tuple, list or set of them) that names a backend or a shard style. A
    collection that also names a mesh axis (``axis in ("dp", "tp", "pp")``) is about axes."""
    consts = set()
    for o in (node.left, *node.comparators):
        if isinstance(o, ast.Constant) and isinstance(o.value, str):
            consts.add(o.value)
        elif isinstance(o, (ast.Tuple, ast.List, ast.Set)):
            consts |= {e.value for e in o.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return bool(consts & BACKEND_NAMES) and not consts & (MESH_AXES - BACKEND_NAMES)


def test_backend_names_are_compared_only_in_backends():
    """Everything outside ``flowrl.backends`` (the config included) reads a backend's spec in
    ``flowrl.catalog.backends`` (its capabilities, ``ShardStyle`` members) instead of its name."""
    found = []
    for module, path in _module_files().items():
        if module.startswith("flowrl.backends"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and _compares_backend_name(node):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"backend-name or shard-style branches outside flowrl/backends: {found}"


def test_the_backend_name_check_catches_every_form():
    def flagged(src: str) -> bool:
        return _compares_backend_name(ast.parse(src).body[0].value)

    for src in ('strategy == "megatron"', 'name != "hf"', 'strategy in ("dp", "fsdp")', 'x not in {"vllm"}',
                'spec.shard_style == "fsdp"', '"megatron" == cfg.actor.strategy', 'style in ["hf", "vllm"]'):
        assert flagged(src), src
    for src in ('axis not in ("dp", "tp", "pp")', 'mode == "stream"', 'style is ShardStyle.HF'):
        assert not flagged(src), src


@pytest.mark.parametrize("limit_lines,limit_function", [(500, 60)])
def test_modules_and_functions_stay_readable(limit_lines, limit_function):
    long_modules, long_functions = [], []
    for path in _module_files().values():
        text = path.read_text()
        if text.count("\n") > limit_lines:
            long_modules.append(f"{path.relative_to(ROOT)} ({text.count(chr(10))} lines)")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit_function:
                    long_functions.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long_modules and not long_functions, (long_modules, long_functions)


def test_test_helpers_live_under_tests():
    shipped = [str(p.relative_to(ROOT)) for p in _module_files().values() if "testing" in p.stem]
    assert not shipped, f"test helpers in the library (move them to tests/flowrl_testing): {shipped}"


def test_test_modules_have_unique_basenames():
    """pytest's default import mode imports test modules by basename: two files of one name in
    different test folders stop the whole run at collection ("import file mismatch"), as
    tests/unit/test_vlm_critic.py and tests/dist/test_vlm_critic.py did."""
    from collections import Counter

    names = Counter(p.name for p in (ROOT / "tests").rglob("test_*.py"))
    assert not [n for n, k in names.items() if k > 1], sorted(n for n, k in names.items() if k > 1)
