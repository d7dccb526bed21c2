"""`tokenmill submit`: produce GenerateRequests to Kafka and, with --wait, print the results."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import click

from ops.connection.options import kafka_connection, kafka_options


@click.command()
@kafka_options
@click.argument("prompt", required=False)
@click.option(
    "--file",
    "jobs_file",
    type=click.Path(exists=True, dir_okay=False),
    help="JSONL: one GenerateRequest per line (an `id` is added when missing).",
)
@click.option("--topic", default="tokenmill.requests", show_default=True)
@click.option(
    "--results-topic",
    default="tokenmill.results",
    show_default=True,
    help="Where --wait reads results (requests may name their own reply_to).",
)
@click.option("--max-new-tokens", type=int, default=None, help="For PROMPT.")
@click.option("--temperature", type=float, default=None, help="For PROMPT.")
@click.option("--chat", is_flag=True, help="Send PROMPT as a user chat message.")
@click.option("--model", default=None, help="For PROMPT: the model name it must run on.")
@click.option("--wait", is_flag=True, help="Wait for every result and print it (JSON lines).")
@click.option(
    "--timeout",
    type=float,
    default=120.0,
    show_default=True,
    help="Seconds --wait waits for the last result.",
)
def submit(**kwargs: Any) -> None:
    """Produce generation requests: a PROMPT, or every line of --file.

    Prints the id of each request sent; with --wait, prints each result as a JSON line as it
    arrives and exits 1 if any is missing at --timeout or came back with an error.
    """
    from ops.errors import SubmitError
    from ops.submit.client import SubmitClient, read_jobs
    from ops.worker.telemetry import setup_tracing, shutdown_tracing

    if bool(kwargs["prompt"]) == bool(kwargs["jobs_file"]):
        raise click.UsageError("give a PROMPT or --file, not both and not neither")
    if kwargs["jobs_file"]:
        try:
            requests = read_jobs(Path(kwargs["jobs_file"]))
        except ValueError as exc:
            raise click.ClickException(str(exc)) from exc
    else:
        requests = [_prompt_request(kwargs)]
    client = SubmitClient(kafka_connection(kwargs), kwargs["topic"], kwargs["results_topic"])
    try:
        tracing = setup_tracing("tokenmill-cli")
        try:
            ok = asyncio.run(_submit(client, requests, kwargs["wait"], kwargs["timeout"]))
        finally:
            shutdown_tracing(tracing)
    except SubmitError as exc:
        raise click.ClickException(str(exc)) from exc
    sys.exit(0 if ok else 1)


def _prompt_request(kwargs: dict[str, Any]) -> Any:
    from messages.request import ChatMessage, GenerateRequest

    fields: dict[str, Any] = {"id": f"submit-{uuid.uuid4().hex[:12]}", "model": kwargs["model"]}
    if kwargs["chat"]:
        fields["messages"] = [ChatMessage(role="user", content=kwargs["prompt"])]
    else:
        fields["prompt"] = kwargs["prompt"]
    if kwargs["max_new_tokens"] is not None:
        fields["max_new_tokens"] = kwargs["max_new_tokens"]
    if kwargs["temperature"] is not None:
        fields["temperature"] = kwargs["temperature"]
    return GenerateRequest(**fields)


async def _submit(client: Any, requests: list[Any], wait: bool, within_s: float) -> bool:
    import msgspec

    encoder = msgspec.json.Encoder()
    async with client:
        await client.send(requests)
        click.echo(f"sent {len(requests)} request(s) to {client.topic}", err=True)
        if not wait:
            for request in requests:
                click.echo(request.id)
            return True
        ok = True
        started = time.monotonic()
        async for result in client.results({r.id for r in requests}, within_s):
            ok &= result.error is None
            click.echo(encoder.encode(result).decode())
        missing = client.missing
        if missing:
            click.echo(
                f"{len(missing)} result(s) missing after {time.monotonic() - started:.0f} s: "
                + ", ".join(sorted(missing)[:10]),
                err=True,
            )
        return ok and not missing
