"""The import structure a newcomer can rely on, drawn from the source: no circles, no imports hidden in functions,
fleet never reads runs, training never reads the dashboard, only the task layer imports the Celery tasks, and the
pure ranking loads neither Django nor an HTTP client."""

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("config", "fleet", "runs", "training")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _imported(name: str, path: Path, node) -> list[str]:
    """The project modules one import statement loads (the deepest module each name resolves to)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    if isinstance(node, ast.Import):
        wanted = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            parent = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join(parent + ([base] if base else []))
        wanted = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
    found = []
    for target in wanted:
        while target and target not in MODULES:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.append(target)
    return found


def _graph() -> tuple[dict[str, set[str]], list[tuple[str, str]]]:
    graph, hidden = {}, []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        graph[name] = {t for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
                       for t in _imported(name, path, node)}
        for function in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    if name.endswith(".apps") and function.name == "ready":  # Django's place for them: models loaded
                        graph[name] |= set(_imported(name, path, node))
                    else:
                        hidden += [(name, t) for t in _imported(name, path, node)]
    return graph, hidden


GRAPH, HIDDEN = _graph()


def _cycle() -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        stack.pop()
        return None

    for module in sorted(GRAPH):
        if module not in state and (found := visit(module)):
            return found
    return None


def test_it_has_no_import_circle():
    assert _cycle() is None, " -> ".join(_cycle())


def test_it_imports_the_dashboards_modules_at_the_top_of_a_file_only():
    # The trainer loads its Triton kernels where a GPU path first runs (Triton is not importable on every box);
    # the dashboard has no such reason, so an import inside a function there only hides a circle.
    assert [(a, b) for a, b in HIDDEN if not a.startswith("training")] == []


def test_it_keeps_each_layer_to_what_is_below_it():
    upward = sorted((a, b) for a, targets in GRAPH.items() for b in targets if (
        (a.startswith("fleet") and b.startswith(("runs", "config")))
        or (a.startswith("training") and not b.startswith("training"))
        or (b in ("fleet.tasks", "runs.tasks") and a not in ("fleet.tasks", "runs.tasks"))))
    assert upward == []


def test_it_loads_the_pure_ranking_without_django_or_http():
    code = ("import sys, fleet.ranking; "
            "print(sorted(m for m in ('django', 'httpx', 'celery', 'fleet.providers.vast') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
