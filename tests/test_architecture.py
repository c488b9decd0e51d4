"""Import contracts: the dependencies between the repository's packages run one way.

    tfc_apps  ->  pto  ->  tf_commlib          datacache (on its own)

(tfc_apps, the applications and benchmarks, may import all three; nothing here constrains it.)

* tf_commlib (the library) imports none of datacache, pto, tfc_apps;
* datacache imports none of tf_commlib, pto, tfc_apps;
* pto imports none of datacache, tfc_apps (it builds on tf_commlib);
* no import cycle among tf_commlib's parts (its top-level modules and subpackages, a subpackage
  such as tf_commlib.collectives being one part; tf_commlib/__init__.py, the facade every submodule
  import passes through, is none);
* no import cycle among the files of tf_commlib and pto (``from package import name`` is an import of
  package/name.py where that file exists, else of package/__init__.py).

Every import counts, at any depth (in functions, methods, ``if`` blocks, ``try``), relative ones
resolved, and ``importlib.import_module("...")`` / ``__import__("...")`` of a literal name: a lazy
import is still a dependency. Read with ``ast`` only, nothing is imported, so this runs in well under
a second; a failure names the file, the line and the module imported.
"""
import ast
import functools
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent

FORBIDDEN = {
    "tf_commlib": ("datacache", "pto", "tfc_apps"),
    "datacache": ("tf_commlib", "pto", "tfc_apps"),
    "pto": ("datacache", "tfc_apps"),
}
LIBRARY = "tf_commlib"


# -- the reader ----------------------------------------------------------------------------------
def _module_of(relpath):
    """'tf_commlib/collectives/__init__.py' -> (module parts, package parts)."""
    parts = relpath[:-len(".py")].split("/")
    if parts[-1] == "__init__":
        return parts[:-1], parts[:-1]
    return parts, parts[:-1]


@functools.lru_cache(maxsize=None)
def imports_of(source, relpath):
    """[(line, module, names)] for every import in `source` (the file at `relpath`, relative to the
    repository root), at any nesting depth; `names` are the names of ``from module import names``
    (empty for ``import module``), relative imports resolved to absolute module names."""
    _, package = _module_of(relpath)
    found = []
    for node in ast.walk(ast.parse(source, relpath)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module
            if node.level:
                if node.level - 1 >= len(package):
                    raise ValueError(f"{relpath}:{node.lineno}: relative import beyond the top-level package")
                base = ".".join(package[:len(package) - node.level + 1])
                module = f"{base}.{module}" if module else base
            found.append((node.lineno, module, tuple(alias.name for alias in node.names)))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str) and _dotted(node.func) in _DYNAMIC):
            found.append((node.lineno, node.args[0].value, ()))
    return tuple(sorted(found))   # ast.walk goes breadth first


_DYNAMIC = {"importlib.import_module", "import_module", "__import__"}


def _dotted(func):
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return f"{func.value.id}.{func.attr}"
    return None


@functools.lru_cache(maxsize=None)
def sources(package):
    """{relative path: source} of every .py file under `package`."""
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no .py files under {ROOT / package}"
    return {f.relative_to(ROOT).as_posix(): f.read_text(encoding="utf-8") for f in files}


# -- the contracts -------------------------------------------------------------------------------
def violations(files, forbidden):
    """'path:line imports module' for each import in files ({path: source}) of a module in (or
    under) one of the packages `forbidden`."""
    out = []
    for relpath, source in files.items():
        for line, module, _ in imports_of(source, relpath):
            if module.split(".")[0] in forbidden:
                out.append(f"{relpath}:{line} imports {module}")
    return out


def part_graph(files, top=LIBRARY):
    """{(part, part): ['path:line', ...]} for the imports between the parts of package `top` in files
    ({path: source}); a part is a top-level module or subpackage of `top`."""
    def part(module):
        bits = module.split(".")
        return ".".join(bits[:2]) if bits[0] == top and len(bits) > 1 else None

    def exists(name):   # tf_commlib.<name> is a module or a subpackage
        return any(p == f"{top}/{name}.py" or p.startswith(f"{top}/{name}/") for p in files)

    edges = {}
    for relpath, source in files.items():
        module, _ = _module_of(relpath)
        if len(module) < 2:   # the facade, tf_commlib/__init__.py
            continue
        here = ".".join(module[:2])
        for line, target, names in imports_of(source, relpath):
            if target == top:   # from tf_commlib import ops, costmodel
                targets = [f"{top}.{n}" for n in names if exists(n)]
            else:
                targets = [part(target)] if part(target) else []
            for t in targets:
                if t != here:
                    edges.setdefault((here, t), []).append(f"{relpath}:{line}")
    return edges


def file_graph(files, tops=(LIBRARY,)):
    """{(path, path): ['path:line', ...]} for the imports between the files of files ({path: source})
    under the packages `tops`."""
    modules = {".".join(_module_of(p)[0]): p for p in files}
    edges = {}
    for relpath, source in files.items():
        for line, target, names in imports_of(source, relpath):
            if target.split(".")[0] not in tops:
                continue
            found = {modules.get(f"{target}.{n}") or modules.get(target) for n in names} if names \
                else {modules.get(target)}
            for path in found - {None, relpath}:
                edges.setdefault((relpath, path), []).append(f"{relpath}:{line}")
    return edges


def cycles(edges):
    """One cycle [a, b, ..., a] per strongly connected component of the graph with these edges."""
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def connect(v):   # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    found = []
    for component in components:   # a shortest way back to the smallest node, inside the component
        start = min(component)
        paths, queue = {start: [start]}, [start]
        while queue:
            v = queue.pop(0)
            for w in sorted(graph[v] & component):
                if w == start:
                    found.append(paths[v] + [start])
                    queue = []
                    break
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    queue.append(w)
    return found


def describe(cycle, edges):
    return "\n".join(f"  {a} -> {b}   ({', '.join(edges[a, b])})" for a, b in zip(cycle, cycle[1:]))


def check_forbidden(package):
    found = violations(sources(package), FORBIDDEN[package])
    assert not found, (f"{package} must not import {', '.join(FORBIDDEN[package])}:\n  " + "\n  ".join(found))


# -- the repository ------------------------------------------------------------------------------
def test_tf_commlib_imports_neither_datacache_nor_pto_nor_tfc_apps():
    check_forbidden("tf_commlib")


def test_datacache_imports_neither_tf_commlib_nor_pto_nor_tfc_apps():
    check_forbidden("datacache")


def test_pto_imports_neither_datacache_nor_tfc_apps():
    check_forbidden("pto")


def test_no_import_cycle_among_the_parts_of_tf_commlib():
    edges = part_graph(sources(LIBRARY))
    assert len(edges) > 10, f"only {len(edges)} imports between parts: is the reader broken?"
    found = cycles(edges)
    assert not found, "import cycles among tf_commlib's parts:\n" + "\n".join(describe(c, edges) for c in found)


def test_auto_decides_without_tensorflow_horovod_or_keras():
    """tf_commlib/auto/decide.py, the choice from measurements: the standard library only."""
    found = [f"{line} imports {module}" for line, module, _ in imports_of(*_source("tf_commlib/auto/decide.py"))
             if module.split(".")[0] not in ("math", "dataclasses", "json", "functools", "itertools")]
    assert not found, found


def test_tf_commlib_auto_does_not_import_tf_commlib_keras():
    found = violations({p: s for p, s in sources(LIBRARY).items() if p.startswith("tf_commlib/auto/")}, ())
    found += [f"{p}:{line} imports {module}" for p, s in sources(LIBRARY).items() if p.startswith("tf_commlib/auto/")
              for line, module, _ in imports_of(s, p) if module.startswith("tf_commlib.keras")]
    assert not found, found


def _source(relpath):
    return (ROOT / relpath).read_text(encoding="utf-8"), relpath


def test_no_import_cycle_among_files():
    files = {**sources(LIBRARY), **sources("pto")}
    edges = file_graph(files, (LIBRARY, "pto"))
    assert len(edges) > 50, f"only {len(edges)} imports between files: is the reader broken?"
    found = cycles(edges)
    assert not found, "import cycles among files:\n" + "\n".join(describe(c, edges) for c in found)


# -- the checker itself: it can fail -------------------------------------------------------------
SYNTHETIC = '''
import os
from tf_commlib import ops

class Loader:
    def load(self):
        if os.environ.get("X"):
            try:
                from datacache.cache import DataCache
            except ImportError:
                import pto.lars as lars
        from ..collectives import wire
        from . import sibling
        return importlib.import_module("tfc_apps.train")
'''


def test_the_checker_sees_every_import():
    found = imports_of(SYNTHETIC, "tf_commlib/keras/loader.py")
    assert [(line, module) for line, module, _ in found] == [
        (2, "os"), (3, "tf_commlib"), (9, "datacache.cache"), (11, "pto.lars"),
        (12, "tf_commlib.collectives"), (13, "tf_commlib.keras"), (14, "tfc_apps.train")]
    assert violations({"tf_commlib/keras/loader.py": SYNTHETIC}, FORBIDDEN["tf_commlib"]) == [
        "tf_commlib/keras/loader.py:9 imports datacache.cache",
        "tf_commlib/keras/loader.py:11 imports pto.lars",
        "tf_commlib/keras/loader.py:14 imports tfc_apps.train"]
    assert violations({"pto/x.py": "def f():\n    from tf_commlib import ops\n"}, FORBIDDEN["pto"]) == []


def test_the_checker_finds_a_cycle():
    files = {
        "tf_commlib/__init__.py": "from tf_commlib.c import thing\n",   # the facade is no part
        "tf_commlib/a.py": "from tf_commlib import b\n",
        "tf_commlib/b.py": "def f():\n    from tf_commlib.c.inner import g\n",
        "tf_commlib/c/__init__.py": "",
        "tf_commlib/c/inner.py": "from .. import a\nfrom . import helper\n",
        "tf_commlib/c/helper.py": "",
        "tf_commlib/d.py": "from tf_commlib import a, GradientAggregator\n",
    }
    edges = part_graph(files)
    assert edges[("tf_commlib.b", "tf_commlib.c")] == ["tf_commlib/b.py:2"]
    assert ("tf_commlib.c", "tf_commlib.c") not in edges   # inside a part
    assert cycles(edges) == [["tf_commlib.a", "tf_commlib.b", "tf_commlib.c", "tf_commlib.a"]]
    assert "tf_commlib.c -> tf_commlib.a   (tf_commlib/c/inner.py:1)" in describe(cycles(edges)[0], edges)
    del files["tf_commlib/b.py"]
    assert cycles(part_graph(files)) == []


def test_the_checker_finds_a_cycle_between_files_of_one_part():
    """Two files of one subpackage that import each other, one of them inside a function and one
    through the package: a cycle between files that the part graph does not see."""
    files = {
        "tf_commlib/k/__init__.py": "from tf_commlib.k.opt import Opt\n",
        "tf_commlib/k/opt.py": "from tf_commlib.k import probe\n",
        "tf_commlib/k/probe.py": "def f():\n    from tf_commlib.k.cb import g\n",
        "tf_commlib/k/cb.py": "from tf_commlib.k import Opt\n",   # through k/__init__.py
    }
    assert cycles(part_graph(files)) == []
    edges = file_graph(files)
    assert edges[("tf_commlib/k/probe.py", "tf_commlib/k/cb.py")] == ["tf_commlib/k/probe.py:2"]
    assert cycles(edges) == [["tf_commlib/k/__init__.py", "tf_commlib/k/opt.py", "tf_commlib/k/probe.py",
                              "tf_commlib/k/cb.py", "tf_commlib/k/__init__.py"]]
    files["tf_commlib/k/probe.py"] = ""
    assert cycles(file_graph(files)) == []
