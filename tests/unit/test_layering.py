"""The map's rules, read from the code: who may import whom, and no import circles.

Every import counts, at the top of a module, inside a function or under TYPE_CHECKING: a
circle that only a lazy import keeps from failing is still a circle for a reader.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("actors", "gpu", "messages", "ops")
# `gpu/` runs on accelerator machines that have none of the service's libraries.
GPU_MAY_USE = {
    "torch",
    "safetensors",
    "tokenizers",
    "numpy",
    "gguf",
    "jinja2",
    "triton",
    "llguidance",  # structured output's grammars (gpu/grammar/)
}
# No torch, no I/O.
PURE = ("gpu.scheduler", "gpu.kv_cache_manager", "gpu.block_allocator", "gpu.sequence")


@cache
def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


@cache
def imports(module: str) -> frozenset[str]:
    """Every absolute name `module` imports (`a.b` for `from a import b` when `a.b` is one of
    ours, else `a`)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(modules()[module].read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                names.add(full if full in modules() else node.module)
    return frozenset(names)


def ours(module: str) -> set[str]:
    return {name for name in imports(module) if name in modules() and name != module}


def third_party(module: str) -> set[str]:
    tops = {name.split(".")[0] for name in imports(module)}
    return tops - set(sys.stdlib_module_names) - set(PACKAGES) - {"__future__"}


def needs(
    module: str,
    edges: Callable[[str], set[str]] = ours,
    libraries: Callable[[str], set[str]] = third_party,
) -> set[str]:
    """The libraries beyond the standard library that importing `module` needs: its own and
    those of every module of ours it imports, however indirectly."""
    seen: set[str] = set()
    todo = [module]
    found: set[str] = set()
    while todo:
        if (m := todo.pop()) not in seen:
            seen.add(m)
            found |= libraries(m)
            todo.extend(edges(m))
    return found


def circles(edges: Callable[[str], set[str]] = ours) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while (w := stack.pop()) != v:
                group.append(w)
            if group:
                found.append(sorted([v, *group]))

    for module in modules():
        if module not in index:
            visit(module)
    return found


def test_the_product_has_no_import_circles() -> None:
    assert circles() == []


def test_a_circle_would_be_found() -> None:
    back = {"gpu.scheduler": {"gpu.engine"}}  # as if the scheduler imported the engine
    found = circles(lambda m: ours(m) | back.get(m, set()))
    assert any({"gpu.engine", "gpu.scheduler"} <= set(group) for group in found), found


@pytest.mark.parametrize("module", [m for m in modules() if m.startswith("gpu")])
def test_gpu_uses_only_the_engine_libraries_and_none_of_the_service(module: str) -> None:
    assert third_party(module) <= GPU_MAY_USE, f"{module} imports {third_party(module)}"
    assert "asyncio" not in {name.split(".")[0] for name in imports(module)}
    # Of the service, only `messages/` modules that themselves need the standard library alone
    # (the admission rules and error codes): msgspec is not installed where `gpu/` runs.
    outside = {m for m in ours(module) if not m.startswith("gpu")}
    service = sorted(m for m in outside if m.split(".")[0] != "messages")
    assert not service, f"{module} imports {service}: gpu/ imports nothing of ops/ or actors/"
    for m in outside:
        assert needs(m) == set(), f"{module} imports {m}, which needs {needs(m)}"


def test_a_library_behind_a_messages_import_would_be_found() -> None:
    def with_msgspec(m: str) -> set[str]:  # as if the limits imported msgspec
        return third_party(m) | ({"msgspec"} if m == "messages.limits" else set())

    assert "messages.limits" in ours("messages.admission")
    assert needs("messages.admission") == set()
    assert needs("messages.admission", libraries=with_msgspec) == {"msgspec"}


# The gpu/ core: the modules directly in gpu/, gpu/memory/ and gpu/kernels/. It imports nothing
# from the layers above it; the engine's base values (`gpu.model_config`) sit at its base.
ABOVE_THE_CORE = ("gpu.loading", "gpu.models", "gpu.quant")
ASSEMBLERS = {
    "gpu.engine": "builds the engine from a loaded model and its layers",
    "gpu.engine_config": "checks the quantization choice; sizes the KV pool for a loaded model",
}


def in_core(module: str) -> bool:
    parts = modules()[module].relative_to(ROOT).parts
    return parts[0] == "gpu" and (len(parts) == 2 or parts[1] in ("memory", "kernels"))


def climbs(module: str, edges: Callable[[str], set[str]] = ours) -> list[str]:
    """What `module` imports from above the core (no edge up is allowed)."""
    return sorted(
        m for m in edges(module) if any(m == a or m.startswith(f"{a}.") for a in ABOVE_THE_CORE)
    )


@pytest.mark.parametrize("module", [m for m in modules() if in_core(m) and m not in ASSEMBLERS])
def test_the_gpu_core_imports_nothing_above_it(module: str) -> None:
    found = climbs(module)
    assert not found, (
        f"{module} imports {', '.join(found)}: the gpu/ core (gpu/*.py, gpu/memory/, gpu/kernels/)"
        f" imports nothing from {', '.join(ABOVE_THE_CORE)}"
    )


def test_an_import_above_the_core_would_be_found() -> None:
    up = {"gpu.kv_pool": {"gpu.models.llama"}, "gpu.kernels.native_weight": {"gpu.quant.linear"}}
    assert climbs("gpu.kv_pool", lambda m: ours(m) | up.get(m, set())) == ["gpu.models.llama"]
    found = climbs("gpu.kernels.native_weight", lambda m: ours(m) | up.get(m, set()))
    assert found == ["gpu.quant.linear"]


def test_the_assemblers_exist() -> None:
    assert set(ASSEMBLERS) <= set(modules()), set(ASSEMBLERS) - set(modules())


# A model file sees a backend only through the interface: the operations its forward is written
# in and the step's inputs. Which backend runs is chosen outside it (gpu/backends/choose.py).
MODEL_SEES = ("gpu.backends.layer_ops", "gpu.backends.metadata")


def backends_named(module: str, edges: Callable[[str], set[str]] = ours) -> list[str]:
    return sorted(m for m in edges(module) if m.startswith("gpu.backends") and m not in MODEL_SEES)


@pytest.mark.parametrize("module", [m for m in modules() if m.startswith("gpu.models.")])
def test_no_model_file_imports_a_backend(module: str) -> None:
    found = backends_named(module)
    assert not found, (
        f"{module} imports {', '.join(found)}: a model is written in LayerOps and names no backend"
    )


def test_a_model_importing_a_backend_would_be_found() -> None:
    up = {"gpu.models.llama": {"gpu.backends.native", "gpu.backends.layer_ops"}}
    found = backends_named("gpu.models.llama", lambda m: ours(m) | up.get(m, set()))
    assert found == ["gpu.backends.native"]


def test_the_model_config_imports_nothing_of_gpu() -> None:
    """`ModelConfig`, the value every layer uses, sits at the base of gpu/."""
    found = sorted(m for m in ours("gpu.model_config") if m.split(".")[0] == "gpu")
    assert not found, f"gpu.model_config imports {found}: it imports nothing of gpu/"


@pytest.mark.parametrize("module", PURE)
def test_the_scheduler_allocator_and_sequence_import_no_torch(module: str) -> None:
    assert third_party(module) == set(), f"{module} imports {third_party(module)}"


@pytest.mark.parametrize("module", [m for m in modules() if m.startswith("messages")])
def test_messages_use_msgspec_only_and_nothing_of_the_service(module: str) -> None:
    assert third_party(module) <= {"msgspec"}, f"{module} imports {third_party(module)}"
    assert {m.split(".")[0] for m in ours(module)} <= {"messages"}, (module, ours(module))


def actor_imports(module: str) -> set[str]:
    return {m for m in ours(module) if m.startswith("actors")}


def test_mail_carries_values_and_imports_no_actor() -> None:
    """`actors.mail` imports from `actors/` only value types that import no actor themselves."""
    for value_type in actor_imports("actors.mail"):
        assert actor_imports(value_type) == set(), (value_type, actor_imports(value_type))


def test_a_swap_reaches_the_gpu_actor_only_through_its_model_slots() -> None:
    for module in [m for m in modules() if m.startswith("actors.swap")]:
        assert "actors.gpu_actor" not in ours(module), module
