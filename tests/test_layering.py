"""The package's shape, as `docs/design.md` ("Layers") states it: each layer imports only the layers
below it (lazy imports inside functions included), no module-level import cycle, no file over 400
lines, no function over 80 lines outside `kernels/`, no mixin classes.

These read the source with `ast`; nothing is imported, so the test needs no JAX.
"""

from __future__ import annotations

import ast
import pathlib

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
