"""`tokenmill trace`: a request's trace from Jaeger, as a tree in the terminal."""

from __future__ import annotations

import json
import re

import click

_TRACE_ID = re.compile(r"[0-9a-f]{32}")


@click.command()
@click.argument("request_id")
@click.option(
    "--jaeger",
    "jaeger_url",
    envvar="TOKENMILL_JAEGER_URL",
    default="http://127.0.0.1:16686",
    show_default=True,
    help="Jaeger's query address (env TOKENMILL_JAEGER_URL).",
)
@click.option("--service", default="tokenmill", show_default=True, help="The worker's service.")
@click.option("--lookback", default="24h", show_default=True, help="How far back to search.")
@click.option("--json", "as_json", is_flag=True, help="Print the trace(s) as Jaeger's JSON.")
def trace(request_id: str, jaeger_url: str, service: str, lookback: str, as_json: bool) -> None:
    """Print the trace of REQUEST_ID (or of a 32-hex trace id) as an indented span tree.

    Finds it through Jaeger's query API by the `tokenmill.request_id` attribute on the
    worker's spans; each line shows a span's name, service, duration and key attributes.
    A request retried or answered twice has several traces: all are printed, newest first.
    """
    from ops.errors import JaegerQueryError
    from ops.trace.query import lookback_seconds, trace_by_id, traces_of_request
    from ops.trace.tree import TraceTree

    try:
        lookback_seconds(lookback)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--lookback") from exc
    try:
        one = trace_by_id(jaeger_url, request_id) if _TRACE_ID.fullmatch(request_id) else None
        traces = (
            [one]
            if one is not None  # a 32-hex request id that is no trace id is searched for too
            else traces_of_request(jaeger_url, request_id, service=service, lookback=lookback)
        )
    except JaegerQueryError as exc:
        raise click.ClickException(str(exc)) from exc
    if not traces:
        raise click.ClickException(
            f"no trace of {request_id!r} in Jaeger at {jaeger_url} (service {service!r}, "
            f"last {lookback}); a sampled-out request has none"
        )
    if as_json:
        click.echo(json.dumps(traces, indent=2))
        return
    for found in traces:
        click.echo("\n".join(TraceTree.of(found).lines()))
