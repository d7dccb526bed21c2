"""A Jaeger trace (the query API's JSON) as an indented tree of spans, for `tokenmill trace`.

    tree = TraceTree.of(trace_json)          # one element of /api/traces' "data"
    for line in tree.lines(): print(line)

    send tokenmill.requests  [tokenmill-cli]  1.2 ms  messaging.destination.name=tokenmill.requests
      process tokenmill.requests  [tokenmill]  812.4 ms  messaging.kafka.offset=17 ...
        prefill  [tokenmill]  40.1 ms  gen_ai.usage.input_tokens=37

A span's parent is its CHILD_OF reference (else its first FOLLOWS_FROM); spans whose parent is
not in the trace are roots. Children are ordered by start time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Attributes worth a glance on one line, in this order; the rest are left to --json.
KEY_ATTRIBUTES = (
    "messaging.destination.name",
    "messaging.destination.partition.id",
    "messaging.kafka.offset",
    "messaging.consumer.group.name",
    "gen_ai.request.model",
    "gen_ai.request.max_tokens",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "gen_ai.response.finish_reasons",
    "tokenmill.request_id",
    "tokenmill.bucket",
    "tokenmill.batch.size",
    "tokenmill.ttft_ms",
    "tokenmill.kv_blocks",
    "tokenmill.preemptions",
    "tokenmill.speculative.draft_tokens",
    "tokenmill.speculative.accepted_tokens",
    "error.type",
)


@dataclass
class SpanNode:
    span_id: str
    name: str
    service: str
    start_us: int
    duration_us: int
    tags: dict[str, Any]
    error: bool
    children: list[SpanNode] = field(default_factory=list)


@dataclass
class TraceTree:
    trace_id: str
    roots: list[SpanNode]
    span_count: int

    @classmethod
    def of(cls, trace: dict[str, Any]) -> TraceTree:
        processes = trace.get("processes", {})
        nodes: dict[str, SpanNode] = {}
        parents: dict[str, str | None] = {}
        for span in trace.get("spans", []):
            tags = {tag["key"]: tag.get("value") for tag in span.get("tags", [])}
            process = processes.get(span.get("processID"), {})
            node = SpanNode(
                span_id=span["spanID"],
                name=span.get("operationName", "?"),
                service=process.get("serviceName", "?"),
                start_us=int(span.get("startTime", 0)),
                duration_us=int(span.get("duration", 0)),
                tags=tags,
                error=tags.get("error") is True or tags.get("otel.status_code") == "ERROR",
            )
            nodes[node.span_id] = node
            parents[node.span_id] = _parent_of(span)
        roots = []
        for span_id, node in nodes.items():
            parent = parents[span_id]
            if parent is not None and parent in nodes:
                nodes[parent].children.append(node)
            else:
                roots.append(node)
        for node in nodes.values():
            node.children.sort(key=lambda child: child.start_us)
        roots.sort(key=lambda root: root.start_us)
        return cls(trace_id=str(trace.get("traceID", "")), roots=roots, span_count=len(nodes))

    def lines(self) -> list[str]:
        out = [f"trace {self.trace_id}  ({self.span_count} spans)"]
        for root in self.roots:
            _render(root, 1, out)
        return out


def _parent_of(span: dict[str, Any]) -> str | None:
    references = span.get("references") or []
    for kind in ("CHILD_OF", "FOLLOWS_FROM"):
        for reference in references:
            if reference.get("refType") == kind:
                return str(reference.get("spanID"))
    return None


def _render(node: SpanNode, depth: int, out: list[str]) -> None:
    shown = [f"{key}={node.tags[key]}" for key in KEY_ATTRIBUTES if key in node.tags]
    mark = "  ERROR" if node.error else ""
    out.append(
        f"{'  ' * depth}{node.name}  [{node.service}]  {node.duration_us / 1000:.1f} ms{mark}"
        + (f"  {' '.join(shown)}" if shown else "")
    )
    for child in node.children:
        _render(child, depth + 1, out)
