"""`tokenmill cancel ID...`: stop requests wherever a worker holds them."""

from __future__ import annotations

import asyncio
from typing import Any

import click

from actors.config import DEFAULT_CANCEL_TOPIC
from ops.connection.options import kafka_connection, kafka_options


@click.command()
@kafka_options
@click.argument("request_ids", metavar="ID...", nargs=-1, required=True)
@click.option("--topic", default=DEFAULT_CANCEL_TOPIC, show_default=True, help="Cancel topic.")
@click.option("--reason", default="user", show_default=True, help="For the workers' logs.")
def cancel(request_ids: tuple[str, ...], topic: str, reason: str, **connection: Any) -> None:
    """Cancel the requests with these ids.

    Every worker reads the cancel topic; the one that holds a request (in a length bucket,
    queued, prefilling or decoding) stops it and sends its result as usual, with
    `finish_reason: "cancelled"` and the tokens made so far. An id no worker holds (unknown,
    already answered, or not fetched from the requests topic yet) is left alone.
    """
    from ops.cancel.client import CancelSender
    from ops.errors import CancelError

    async def send() -> int:
        async with CancelSender(kafka_connection(connection), topic) as sender:
            return await sender.cancel(request_ids, reason=reason)

    try:
        sent = asyncio.run(send())
    except CancelError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"sent {sent} cancel record{'s' if sent != 1 else ''} to {topic}")
