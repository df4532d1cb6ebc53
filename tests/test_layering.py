"""The package's shape, as `docs/design.md` ("Layers") states it: each layer imports only the layers
below it (lazy imports inside functions included), no module-level import cycle, no file over 400
lines, no function over 80 lines outside `kernels/`, no mixin classes.

These read the source with `ast`; nothing is imported, so the test needs no JAX.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "radixflow_jax"

# bottom to top; a layer may import its own modules and any layer before it
LAYERS: tuple[tuple[str, ...], ...] = (
    ("paths",),
    ("kernels",),
    ("models",),
    ("cache",),
    ("scheduler",),
    ("runner",),
    ("engine",),
    ("sim",),
    ("replicas",),
    ("reliability",),
    ("llm",),
    ("serve",),
    ("batch", "bench"),
    ("cli",),
)
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 80


def _sources() -> list[pathlib.Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _module(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> str | None:
    """The first component below the package (``radixflow_jax.engine.core`` -> ``engine``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _imports(tree: ast.AST, module: str, *, top_level_only: bool) -> set[str]:
    """The project modules ``tree`` imports (``from radixflow_jax.x import y`` counts ``x.y`` when
    ``y`` is a module of the package, else ``x``)."""
    nodes = ast.iter_child_nodes(tree) if top_level_only else ast.walk(tree)
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "radixflow_jax"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != "radixflow_jax":
                continue
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if _is_module(sub) else node.module)
    found.discard(module)
    return found


def _is_module(name: str) -> bool:
    rel = pathlib.Path(*name.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").exists() or (PACKAGE / rel / "__init__.py").exists()


def test_every_package_has_a_layer():
    tops = {p.relative_to(PACKAGE).parts[0].removesuffix(".py") for p in _sources()}
    assert tops - {"__init__"} <= set(RANK), f"add these to LAYERS and docs/design.md: {tops - set(RANK)}"


def test_layers_import_only_downwards():
    bad = []
    for path in _sources():
        module = _module(path)
        own = _layer(module)
        if own is None:  # the package's lazy top-level names (LLM, SamplingParams)
            continue
        for target in _imports(ast.parse(path.read_text()), module, top_level_only=False):
            layer = _layer(target)
            if layer is not None and layer != own and RANK[layer] > RANK[own]:
                bad.append(f"{module} imports {target} ({own} is below {layer})")
    assert not bad, "\n".join(bad)


def test_no_import_cycle():
    graph = {}
    for path in _sources():
        module = _module(path)
        graph[module] = _imports(ast.parse(path.read_text()), module, top_level_only=True) & {
            _module(p) for p in _sources()
        }
    state: dict[str, int] = {}  # 1: on the stack, 2: done

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt) :] + [nxt] if nxt in stack else [node, nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_files_and_functions_are_of_normal_size():
    long_files, long_functions = [], []
    for path in _sources():
        text = path.read_text()
        rel = path.relative_to(PACKAGE)
        if text.count("\n") > MAX_FILE_LINES:
            long_files.append(f"{rel}: {text.count(chr(10))} lines")
        if rel.parts[0] == "kernels":
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append(f"{rel}:{node.lineno} {node.name}: {length} lines")
    assert not long_files, "\n".join(long_files)
    assert not long_functions, "\n".join(long_functions)


def test_no_mixins():
    mixins = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                names = [node.name] + [ast.unparse(b) for b in node.bases]
                if any(n.endswith("Mixin") for n in names):
                    mixins.append(f"{path.relative_to(PACKAGE)}: class {node.name}")
    assert not mixins, "\n".join(mixins)


# --------------------------------------------------------------------------- one owner for a request's fields
REQUEST_MODULES = ("scheduler/request.py", "scheduler/allocator.py")  # the only writers of a Request's fields
REQUEST_HOLDERS = {"requests", "running", "waiting", "members", "fenced", "twins"}  # attributes holding Requests
MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse", "appendleft", "popleft"}


def _request_fields() -> set[str]:
    tree = ast.parse((PACKAGE / "scheduler" / "request.py").read_text())
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "Request")
    return {s.target.id for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}


def _yields_requests(expr: ast.AST, known: set[str]) -> bool:
    """Whether ``expr`` is (or holds) scheduler requests: a name already known to, a ``Request(...)``
    call, a scheduler container of them (``scheduler.requests``, ``running``, ``waiting``, ...), or
    an item, copy, iteration or selection of one of these."""
    if isinstance(expr, ast.Name):
        return expr.id in known or expr.id.lstrip("_") in REQUEST_HOLDERS
    if isinstance(expr, ast.Attribute):
        return expr.attr.lstrip("_") in REQUEST_HOLDERS
    if isinstance(expr, ast.Subscript):
        return _yields_requests(expr.value, known)
    if isinstance(expr, ast.Call):
        func = expr.func
        if isinstance(func, ast.Name) and func.id == "Request":
            return True
        if isinstance(func, ast.Name) and func.id in {"list", "tuple", "reversed", "sorted", "next", "iter", "set"}:
            return bool(expr.args) and _yields_requests(expr.args[0], known)
        return isinstance(func, ast.Attribute) and func.attr in {"get", "pop", "values", "copy", "popleft"} and (
            _yields_requests(func.value, known)
        )
    if isinstance(expr, (ast.GeneratorExp, ast.ListComp, ast.SetComp)):
        return _yields_requests(expr.generators[0].iter, known)
    if isinstance(expr, ast.IfExp):
        return _yields_requests(expr.body, known) or _yields_requests(expr.orelse, known)
    if isinstance(expr, ast.BoolOp):
        return any(_yields_requests(v, known) for v in expr.values)
    return False


def _bind(target: ast.AST, value: ast.AST | None, known: set[str]) -> None:
    """Adds the names ``target`` binds to requests (tuples unpacked item by item when both sides are)."""
    if isinstance(target, (ast.Tuple, ast.List)):
        if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
            for t, v in zip(target.elts, value.elts):
                _bind(t, v, known)
        elif value is not None and _yields_requests(value, known):
            known.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    elif isinstance(target, ast.Name) and value is not None and _yields_requests(value, known):
        known.add(target.id)


def _request_names(func: ast.AST, imports_request: bool) -> set[str]:
    """The names that hold a scheduler ``Request`` (or a collection of them) inside ``func``: its
    parameters annotated with ``Request`` and what is bound from one (to a fixed point)."""
    known: set[str] = set()
    if imports_request:
        for arg in ast.walk(func.args):
            if isinstance(arg, ast.arg) and arg.annotation is not None:
                if re.search(r"\bRequest\b", ast.unparse(arg.annotation)):
                    known.add(arg.arg)
    size = -1
    while size != len(known):
        size = len(known)
        for node in ast.walk(func):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    _bind(target, node.value, known)
            elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
                _bind(node.target, node.value, known)
            elif isinstance(node, (ast.For, ast.comprehension)):
                _bind(node.target, node.iter, known)
    return known


def _field_writes(func: ast.AST, names: set[str], fields: set[str]) -> list[tuple[int, str]]:
    """``(line, text)`` of each write to a field of a request held by ``names``: ``=``, ``op=``,
    ``del``, an item store (``req.output[i] = t``) or a mutating call (``req.output.append(t)``)."""
    targets: list[tuple[int, ast.AST]] = []
    for node in ast.walk(func):
        if isinstance(node, ast.Assign):
            targets += [(node.lineno, t) for t in node.targets]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets.append((node.lineno, node.target))
        elif isinstance(node, ast.Delete):
            targets += [(node.lineno, t) for t in node.targets]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            targets.append((node.lineno, node.func.value))
    found = []
    for line, target in targets:
        for t in target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]:
            while isinstance(t, ast.Subscript):
                t = t.value
            if isinstance(t, ast.Attribute) and t.attr in fields:
                if isinstance(t.value, ast.Name) and t.value.id in names:
                    found.append((line, ast.unparse(t)))
    return found


def _imports_request(node: ast.AST) -> bool:
    """``node`` imports the scheduler's ``Request``."""
    if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith("radixflow_jax.scheduler"):
        return False
    return any(a.name == "Request" for a in node.names)


def request_field_writes() -> list[str]:
    """Every write to a field of a scheduler ``Request`` in the package outside ``REQUEST_MODULES``.
    Only layers from the scheduler up can hold a request."""
    fields, bad = _request_fields(), []
    for path in _sources():
        rel = path.relative_to(PACKAGE)
        layer = rel.parts[0].removesuffix(".py")
        if rel.as_posix() in REQUEST_MODULES or RANK.get(layer, len(LAYERS)) < RANK["scheduler"]:
            continue
        tree = ast.parse(path.read_text())
        imports_request = any(_imports_request(n) for n in ast.walk(tree))
        seen = set()
        for func in ast.walk(tree):
            if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                for line, text in _field_writes(func, _request_names(func, imports_request), fields):
                    if (line, text) not in seen:
                        seen.add((line, text))
                        bad.append(f"{rel}:{line}: {text}")
    return sorted(bad)


def test_request_fields_are_written_only_by_the_scheduler():
    """A request is changed through methods of ``scheduler/request.py`` and the allocator (seat,
    advance, release) and, from outside the scheduler, through the ``Scheduler``'s methods."""
    bad = request_field_writes()
    assert not bad, "write these through a Request / Allocator method instead:\n" + "\n".join(bad)


def test_the_request_rule_sees_every_kind_of_write():
    """The rule above on a sample: annotated parameters, requests taken from the scheduler's tables
    and what is bound from them, every kind of write; never ``self`` or another class's field."""
    sample = """
def f(self, req: Request, rid):
    req.num_computed = 1
    req.epoch += 1
    req.output[0] = 7
    req.output.append(1)
    del req.pages[:]
    other, rec = self.scheduler.requests[rid], self._records[rid]
    other.finish_reason = "stop"
    rec.finish_reason = "stop"
    for partner in reversed(list(self.members)):
        partner.status, x = None, 1
    victim = next((r for r in self.running if r), None)
    victim.slot = 3
    self.slot = 4
    out = rec.output
    out.cached_tokens = 3
"""
    func = ast.parse(sample).body[0]
    names = _request_names(func, imports_request=True)
    assert {"req", "other", "partner", "victim"} <= names and not {"self", "rec", "out"} & names
    writes = [text for _, text in sorted(_field_writes(func, names, _request_fields()))]
    assert writes == [
        "req.num_computed",
        "req.epoch",
        "req.output",
        "req.output",
        "req.pages",
        "other.finish_reason",
        "partner.status",
        "victim.slot",
    ]


def test_every_class_name_is_defined_once():
    """One meaning per name (docs/design.md, "Glossary"): no two classes of the package share a name,
    so a name in a traceback, a doc or a grep points at one thing."""
    homes: dict[str, list[str]] = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                homes.setdefault(node.name, []).append(_module(path))
    assert {name: where for name, where in homes.items() if len(where) > 1} == {}
