"""`TraceTree`: Jaeger's trace JSON → the indented lines `tokenmill trace` prints."""

from __future__ import annotations

from typing import Any

from ops.trace.tree import TraceTree


def span(span_id: str, name: str, start: int, *, parent: str = "", ref: str = "CHILD_OF",
         tags: dict[str, Any] | None = None, process: str = "p1") -> dict[str, Any]:  # fmt: skip
    return {
        "spanID": span_id,
        "operationName": name,
        "startTime": start,
        "duration": 1500,
        "processID": process,
        "references": [{"refType": ref, "spanID": parent}] if parent else [],
        "tags": [{"key": k, "value": v} for k, v in (tags or {}).items()],
    }


def trace(*spans: dict[str, Any]) -> dict[str, Any]:
    processes = {"p1": {"serviceName": "tokenmill"}, "p2": {"serviceName": "tokenmill-cli"}}
    return {"traceID": "t1", "spans": list(spans), "processes": processes}


def test_children_are_indented_under_their_parent_in_start_order() -> None:
    tree = TraceTree.of(
        trace(
            span("c", "decode", 30, parent="b"),
            span("a", "send tokenmill.requests", 10, process="p2"),
            span("b", "process tokenmill.requests", 20, parent="a"),
            span("d", "prefill", 25, parent="b", tags={"gen_ai.usage.input_tokens": 37}),
        )
    )
    assert tree.lines() == [
        "trace t1  (4 spans)",
        "  send tokenmill.requests  [tokenmill-cli]  1.5 ms",
        "    process tokenmill.requests  [tokenmill]  1.5 ms",
        "      prefill  [tokenmill]  1.5 ms  gen_ai.usage.input_tokens=37",
        "      decode  [tokenmill]  1.5 ms",
    ]


def test_a_span_whose_parent_is_missing_is_a_root_and_links_count_as_parents() -> None:
    tree = TraceTree.of(
        trace(
            span("x", "orphan", 1, parent="gone"),
            span("y", "batch", 2, parent="x", ref="FOLLOWS_FROM"),
        )
    )
    assert [root.name for root in tree.roots] == ["orphan"]
    assert [child.name for child in tree.roots[0].children] == ["batch"]


def test_errors_are_marked() -> None:
    tree = TraceTree.of(trace(span("e", "process", 1, tags={"error": True, "error.type": "x"})))
    assert tree.lines()[1].endswith("1.5 ms  ERROR  error.type=x")
