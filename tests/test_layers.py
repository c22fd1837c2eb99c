"""Import restrictions: what each package may import, checked on the source (in the spirit of
Kubernetes' ``.import-restrictions``).

Every ``import`` counts, at module level or inside a function, under ``TYPE_CHECKING`` or
not: a lazy import is still a dependency. A rule names a package (a module prefix) and the
prefixes its modules must not import, with the few modules excepted by name and why. The
server's folders are its layers (``src/gpufleet/server/README.md``); besides the rules,
the graph of those folders must have no cycle.

``test_a_planted_import_fails`` plants a bad import in a copy of a small tree and checks
that the checker names it, so this test cannot pass by finding nothing.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

SERVER = "gpufleet.server"
OUTSIDE = ("gpufleet.agent", "gpufleet.gateway", "gpufleet.cli", "gpufleet.client", "gpufleet.slurm")


@dataclass(frozen=True)
class Rule:
    package: str
    forbid: tuple[str, ...]
    exempt: dict[str, str] = field(default_factory=dict)
    """module -> why it may break the rule"""


def _server(*folders: str) -> tuple[str, ...]:
    return tuple(f"{SERVER}.{f}" for f in folders)


ASSEMBLY = _server("app", "wiring", "direct")
"""The root's assembly: what builds the app; nothing below may import it."""

BASE = ("defaults", "errors", "problems", "runner")
"""The root's base: what every layer may import."""

LAYERS = ("decide", "config", "store", "jobstate", "services", "loops", "http", "metrics", "routers")
"""The server's layers, bottom up: each imports only those before it (``config`` is
built from ``decide``'s rule types; the metrics read the scheduling loop's pass reports;
the routers use http's dependencies and serve the metrics)."""


def _above(name: str) -> tuple[str, ...]:
    """What ``name`` must not import: every layer from its own height up, and the assembly."""
    above = LAYERS if name in BASE else LAYERS[LAYERS.index(name) + 1 :]
    return (*_server(*above), *ASSEMBLY)


RULES: tuple[Rule, ...] = (
    # the pure scheduling core and the simulator around it
    Rule("gpufleet.scheduler", (SERVER, "gpufleet.sim", *OUTSIDE, "sqlalchemy", "fastapi", "httpx")),
    Rule("gpufleet.sim", (SERVER, *OUTSIDE, "sqlalchemy", "fastapi")),
    Rule("gpufleet.api", (SERVER, "gpufleet.scheduler.core", *OUTSIDE, "sqlalchemy", "fastapi")),
    # other processes: never the server's code
    Rule("gpufleet.agent", (SERVER, "gpufleet.gateway", "gpufleet.cli", "sqlalchemy", "fastapi")),
    Rule("gpufleet.gateway", (SERVER, "gpufleet.agent", "gpufleet.cli", "sqlalchemy")),
    Rule("gpufleet.slurm", (SERVER, "gpufleet.agent", "gpufleet.gateway", "sqlalchemy", "fastapi")),
    Rule("gpufleet.client", (SERVER, "sqlalchemy", "fastapi")),
    Rule(
        "gpufleet.cli",
        (SERVER, "gpufleet.agent.agent", "sqlalchemy", "fastapi"),
        exempt={
            "gpufleet.cli.server_cmds": "the server command builds the server's config",
            "gpufleet.cli.db_cmds": "the db command migrates the database itself",
            "gpufleet.cli.admin_cmds": "admin create-user --database-url writes the database directly",
            "gpufleet.cli.sim_cmds": "simulate shows the server's timeouts as its defaults",
        },
    ),
    # the server's layers, bottom up: the root's base (BASE) < LAYERS < the root's assembly
    *(Rule(f"{SERVER}.{name}", _above(name)) for name in (*BASE, *LAYERS)),
)


def _module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, module: str) -> Iterable[tuple[int, str]]:
    """(line, imported module) for every import in the file, relative ones resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            yield node.lineno, base
            for alias in node.names:  # ``from gpufleet.server import store`` imports a package
                yield node.lineno, f"{base}.{alias.name}"


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _modules(src: Path) -> Iterable[tuple[Path, str]]:
    for path in sorted(src.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        yield path, _module_name(path, src)


def violations(src: Path, rules: Iterable[Rule] = RULES) -> list[str]:
    rules = tuple(rules)
    found = []
    for path, module in _modules(src):
        for rule in rules:
            if not _under(module, rule.package) or module in rule.exempt:
                continue
            for line, target in imports_of(path, module):
                bad = next((p for p in rule.forbid if _under(target, p)), None)
                if bad is not None:
                    where = f"{path.relative_to(src)}:{line}: {module} imports {target}"
                    found.append(f"{where} ({rule.package} must not import {bad})")
    return sorted(set(found))


def folder_cycles(src: Path, root: str = SERVER) -> list[list[str]]:
    """Cycles in the graph of the server's folders (a folder depends on another when one of
    its modules imports one of the other's)."""
    depth = root.count(".") + 2
    graph: dict[str, set[str]] = {}
    for path, module in _modules(src):
        if not _under(module, root) or module.count(".") + 1 < depth:
            continue
        folder = ".".join(module.split(".")[:depth])
        if not (src / Path(*folder.split("."))).is_dir():
            continue
        for _, target in imports_of(path, module):
            if _under(target, root) and target.count(".") + 1 >= depth:
                other = ".".join(target.split(".")[:depth])
                if other != folder and (src / Path(*other.split("."))).is_dir():
                    graph.setdefault(folder, set()).add(other)
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def test_every_package_imports_only_what_its_rule_allows() -> None:
    found = violations(SRC)
    assert not found, "imports across a boundary:\n" + "\n".join(found)


def test_the_server_folders_have_no_import_cycle() -> None:
    cycles = folder_cycles(SRC)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_every_rule_names_a_package_that_exists() -> None:
    modules = {m for _, m in _modules(SRC)}
    for rule in RULES:
        assert any(_under(m, rule.package) for m in modules), rule.package
        for exempt in rule.exempt:
            assert exempt in modules, exempt


def test_a_planted_import_fails(tmp_path: Path) -> None:
    """The checker finds a bad import (module level, lazy, relative) and a folder cycle."""
    pkg = tmp_path / "gpufleet"
    files = {
        "__init__.py": "",
        "server/__init__.py": "",
        "server/decide/__init__.py": "",
        "server/decide/replicas.py": "def f():\n    from gpufleet.server.store import models\n",
        "server/store/__init__.py": "",
        "server/store/models.py": "from ..services import jobs\n",
        "server/services/__init__.py": "",
        "server/services/jobs.py": "import gpufleet.server.store.models\n",
        "agent/__init__.py": "",
        "agent/agent.py": "from gpufleet.server import clock\n",
        "gateway/__init__.py": "",
        "gateway/app.py": "from gpufleet.ratelimit import RateLimits\n",
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    found = violations(tmp_path)
    assert any("decide/replicas.py:2" in f and "gpufleet.server.store" in f for f in found), found
    assert any("store/models.py:1" in f and "gpufleet.server.services" in f for f in found), found
    assert any("agent/agent.py:1" in f for f in found), found
    assert not any("gateway" in f for f in found), found
    assert ["gpufleet.server.services", "gpufleet.server.store", "gpufleet.server.services"] in folder_cycles(
        tmp_path
    ) or ["gpufleet.server.store", "gpufleet.server.services", "gpufleet.server.store"] in folder_cycles(
        tmp_path
    )
