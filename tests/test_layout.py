"""The architecture as the import graph shows it: layers that point down, no import circle, a small top.

The graph is read from the source (every ``import`` and ``from ... import``, at module level or inside a
function, relative ones resolved), the way a tool that draws it would.
"""

import ast
import os

from conftest import REPO

HOOK_MODULES = ("_ptxbackend_pth", "_ptxbackend_boot", "_ptxbackend_env")

# A module may import only modules of a lower rank, or of its own package.  The start-up hook's stages sit
# above the package (stage 2 hands CuPy to hook/); their shared leaf sits below everything.
RANKS = {
    "_ptxbackend_env": 0, "ptxbackend.errors": 0, "ptxbackend._version": 0,
    "ptxbackend.config": 1, "ptxbackend.state": 1,
    "ptxbackend.files": 2,
    "ptxbackend.gpu": 3, "ptxbackend.dependencies": 3,
    "ptxbackend.compilers": 4, "ptxbackend.cache": 4,
    "ptxbackend.compiling": 5,
    "ptxbackend.hook": 6, "ptxbackend.deploy": 6,
    "ptxbackend.cli": 7,
    "_ptxbackend_boot": 8,
    "ptxbackend": 9, "ptxbackend.__main__": 9, "_ptxbackend_pth": 9,
}
#: What may stand at the top of the package besides its subpackages.
TOP_LEVEL = {"__init__.py", "__main__.py", "_version.py", "errors.py", "config.py", "state.py"}


def _module_name(path):
    relative = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
    return (relative[:-len(".__init__")], True) if relative.endswith(".__init__") else (relative, False)


def _sources():
    found = [os.path.join(REPO, name + ".py") for name in HOOK_MODULES]
    for base, dirs, files in os.walk(os.path.join(REPO, "ptxbackend")):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        found.extend(os.path.join(base, f) for f in files if f.endswith(".py"))
    return found


def import_graph():
    """``{module: set of modules it imports}`` for the package and the hook modules."""
    paths = _sources()
    modules = set(_module_name(p)[0] for p in paths)
    graph = {}
    for path in paths:
        name, is_package = _module_name(path)
        package = name if is_package else name.rpartition(".")[0]
        with open(path) as handle:
            tree = ast.parse(handle.read(), path)
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1])
                    source = base + ("." + node.module if node.module else "")
                else:
                    source = node.module or ""
                for alias in node.names:
                    edges.add(source + "." + alias.name if source + "." + alias.name in modules else source)
        graph[name] = set(e for e in edges if e in modules and e != name)
    return graph


def _circles(graph):
    """Strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _rank(module):
    best = None
    for prefix in RANKS:
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(best):
                best = prefix
    return best, RANKS[best]


def test_no_import_circle():
    assert _circles(import_graph()) == []


def test_the_circle_finder_finds_one():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_layers_only_point_down():
    upward = []
    for module, imports in sorted(import_graph().items()):
        home, rank = _rank(module)
        for target in sorted(imports):
            there, target_rank = _rank(target)
            if there != home and target_rank >= rank:
                upward.append("%s -> %s" % (module, target))
    assert upward == []


def test_the_top_of_the_package_keeps_a_handful_of_modules():
    top = set(f for f in os.listdir(os.path.join(REPO, "ptxbackend")) if f.endswith(".py"))
    assert top == TOP_LEVEL
    for name in os.listdir(os.path.join(REPO, "ptxbackend")):
        path = os.path.join(REPO, "ptxbackend", name)
        if os.path.isdir(path) and name not in ("__pycache__", "examples"):
            with open(os.path.join(path, "__init__.py")) as handle:
                doc = ast.get_docstring(ast.parse(handle.read()))
            assert doc and len(doc.split()) > 15, "ptxbackend/%s says what it owns in its docstring" % name


def test_no_test_or_benchmark_file_is_named_after_an_issue():
    named = []
    for top in ("tests", "benchmarks"):
        for base, dirs, files in os.walk(os.path.join(REPO, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            named.extend(os.path.join(base, f) for f in files + dirs if "issue" in f.lower())
    assert named == []
