"""`tokenmill submit`: produce GenerateRequests (or, with --embed, EmbedRequests) to Kafka and,
with --wait, print the results."""

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
    help="JSONL: one GenerateRequest or EmbedRequest per line (an `id` is added when missing; "
    "a line with `input` and no prompt or messages is an EmbedRequest).",
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
@click.option("--seed", type=int, default=None, help="For PROMPT: sample reproducibly.")
@click.option("--n", "choices", type=int, default=None, help="For PROMPT: how many choices (1-16).")
@click.option(
    "--logprobs",
    type=int,
    default=None,
    help="For PROMPT: each token's logprob and its K most likely alternatives (0-20), in the "
    "printed result's `logprobs`.",
)
@click.option(
    "--prompt-logprobs",
    type=int,
    default=None,
    help="For PROMPT: each prompt token's logprob and its K most likely alternatives (0-20), in "
    "the printed result's `prompt_logprobs`; with it --max-new-tokens may be 0 (score the text).",
)
@click.option("--presence-penalty", type=float, default=None, help="For PROMPT: -2 to 2.")
@click.option("--frequency-penalty", type=float, default=None, help="For PROMPT: -2 to 2.")
@click.option("--repetition-penalty", type=float, default=None, help="For PROMPT: 0.01 to 2.")
@click.option("--min-p", type=float, default=None, help="For PROMPT: 0 to 1.")
@click.option("--min-tokens", type=int, default=None, help="For PROMPT: no stop before N tokens.")
@click.option(
    "--logit-bias",
    multiple=True,
    metavar="TOKEN=BIAS",
    help="For PROMPT: add BIAS (-100 to 100) to token id TOKEN's logit (repeat the option).",
)
@click.option("--regex", default=None, help="For PROMPT: the output must match this regex (whole).")
@click.option(
    "--choice",
    "choice",
    multiple=True,
    help="For PROMPT: the output must be one of these strings (repeat the option).",
)
@click.option(
    "--grammar",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="For PROMPT: a Lark or GBNF grammar file the output must be a sentence of.",
)
@click.option("--chat", is_flag=True, help="Send PROMPT as a user chat message.")
@click.option(
    "--embed",
    is_flag=True,
    help="Send PROMPT as a text to embed (an EmbedRequest, for a worker serving an embedding "
    "model); with --file, every line is an EmbedRequest.",
)
@click.option(
    "--dimensions",
    type=click.IntRange(min=1),
    default=None,
    help="With --embed: keep the vectors' first N values, normalized again (Matryoshka).",
)
@click.option(
    "--prompt-name",
    default=None,
    help="With --embed: one of the model's task prompts (e.g. query, document), put before "
    "the text.",
)
@click.option(
    "--truncate",
    type=click.Choice(["none", "end", "start"]),
    default=None,
    help="With --embed: an over-long text is refused (none, the default), cut at its end "
    "(keeps its first tokens) or at its start.",
)
@click.option(
    "--encoding-format",
    type=click.Choice(["float", "base64"]),
    default=None,
    help="With --embed: vectors as lists of numbers (float, the default) or as base64 of "
    "their float32 values, little-endian.",
)
@click.option("--model", default=None, help="For PROMPT: the model name it must run on.")
@click.option("--wait", is_flag=True, help="Wait for every result and print it (JSON lines).")
@click.option(
    "--stream",
    is_flag=True,
    help="Ask for streamed chunks and print the text as it arrives (implies --wait).",
)
@click.option(
    "--timeout",
    type=float,
    default=120.0,
    show_default=True,
    help="Seconds --wait waits for the last result.",
)
def submit(**kwargs: Any) -> None:
    """Produce generation requests: a PROMPT, or every line of --file. With --embed, embedding
    requests: PROMPT is a text to embed, and every line of --file an EmbedRequest.

    Prints the id of each request sent; with --wait, prints each result as a JSON line as it
    arrives and exits 1 if any is missing at --timeout or came back with an error.

    With --stream, every request is sent with `stream: true` and its text is printed as its
    chunks arrive (several requests: each chunk on a line of its own, after `[id] `), then a
    summary line per result on stderr; same exit status as --wait.
    """
    from ops.errors import SubmitError
    from ops.submit.client import SubmitClient, read_jobs
    from ops.worker.telemetry import setup_tracing, shutdown_tracing

    if bool(kwargs["prompt"]) == bool(kwargs["jobs_file"]):
        raise click.UsageError("give a PROMPT or --file, not both and not neither")
    _check_embed_options(kwargs)
    if kwargs["jobs_file"]:
        try:
            requests = read_jobs(Path(kwargs["jobs_file"]), embed=kwargs["embed"])
        except ValueError as exc:
            raise click.ClickException(str(exc)) from exc
    elif kwargs["embed"]:
        requests = [_embed_request(kwargs)]
    else:
        requests = [_prompt_request(kwargs)]
    if kwargs["stream"]:
        for request in requests:
            if not hasattr(request, "stream"):
                raise click.UsageError(f"{request.id} is an embedding request: it has no stream")
            request.stream = True
    client = SubmitClient(kafka_connection(kwargs), kwargs["topic"], kwargs["results_topic"])
    try:
        tracing = setup_tracing("tokenmill-cli")
        try:
            if kwargs["stream"]:
                ok = asyncio.run(_stream(client, requests, kwargs["timeout"]))
            else:
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
    carried = (("temperature", "temperature"), ("seed", "seed"), ("choices", "n"))
    for name, field in (*carried, ("logprobs", "logprobs")):
        if kwargs[name] is not None:
            fields[field] = kwargs[name]
    penalties = ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_p")
    for name in (*penalties, "min_tokens", "prompt_logprobs"):
        if kwargs.get(name) is not None:
            fields[name] = kwargs[name]
    if kwargs.get("logit_bias"):
        fields["logit_bias"] = _logit_bias(kwargs["logit_bias"])
    structured = _structured_output(kwargs)
    if structured is not None:
        fields["structured_output"] = structured
    return GenerateRequest(**fields)


_EMBED_ONLY = ("dimensions", "prompt_name", "truncate", "encoding_format")


def _check_embed_options(kwargs: dict[str, Any]) -> None:
    """--embed's options only with it (and for PROMPT); none of generation's with it."""
    given = [f"--{n.replace('_', '-')}" for n in _EMBED_ONLY if kwargs[n] is not None]
    if given and not (kwargs["embed"] and kwargs["prompt"]):
        raise click.UsageError(f"{', '.join(given)}: only with --embed and a PROMPT")
    if kwargs["embed"] and (kwargs["stream"] or kwargs["chat"]):
        raise click.UsageError("--embed takes no --stream nor --chat")


def _embed_request(kwargs: dict[str, Any]) -> Any:
    from messages.embedding import EmbedRequest

    fields: dict[str, Any] = {"id": f"submit-{uuid.uuid4().hex[:12]}", "model": kwargs["model"]}
    fields["input"] = kwargs["prompt"]
    fields |= {n: kwargs[n] for n in _EMBED_ONLY if kwargs[n] is not None}
    return EmbedRequest(**fields)


def _logit_bias(pairs: tuple[str, ...]) -> dict[int, float]:
    """--logit-bias TOKEN=BIAS options as the request's `logit_bias` (ranges: the worker's)."""
    bias = {}
    for pair in pairs:
        token, _, value = pair.partition("=")
        try:
            bias[int(token)] = float(value)
        except ValueError:
            message = f"{pair!r} is not TOKEN=BIAS"
            raise click.BadParameter(message, param_hint="--logit-bias") from None
    return bias


def _structured_output(kwargs: dict[str, Any]) -> Any:
    """--regex, --choice or --grammar as the request's `structured_output` (one at most)."""
    from messages.structured_output import StructuredOutput

    grammar = kwargs.get("grammar")
    given = StructuredOutput(
        regex=kwargs.get("regex"),
        choice=list(kwargs.get("choice") or ()) or None,
        grammar=Path(grammar).read_text(encoding="utf-8") if grammar else None,
    )
    if len(given.given) > 1:
        raise click.UsageError(
            f"give one of --regex, --choice, --grammar (got {', '.join(given.given)})"
        )
    return given if given.given else None


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
        return ok and _all_answered(client.missing, started)


async def _stream(client: Any, requests: list[Any], within_s: float) -> bool:
    from messages.result import GenerateResult
    from ops.submit.assembly import StreamedText

    one = len(requests) == 1
    texts = {r.id: StreamedText() for r in requests}
    async with client:
        await client.send(requests)
        click.echo(f"sent {len(requests)} request(s) to {client.topic}", err=True)
        ok = True
        started = time.monotonic()
        async for reply in client.replies(set(texts), within_s):
            text = texts[reply.id]
            if not isinstance(reply, GenerateResult):
                if reply.index:  # with n > 1 the first choice is shown, as the result's text
                    continue
                restarted = text.restarted
                added = text.add(reply)
                if text.restarted and not restarted:
                    click.echo(f"\n[{reply.id}] (run again: the text starts over)", err=True)
                if added:
                    _show(reply.id, added, one)
                continue
            ok &= reply.error is None
            rest = text.finish(reply)
            if rest is None:  # what was shown is not how the result begins: show it whole
                click.echo(f"\n[{reply.id}] the result's text:", err=True)
                rest = reply.text
            if rest:
                _show(reply.id, rest, one)
            if one:
                click.echo("")
            error = f", error {reply.error.code}" if reply.error is not None else ""
            click.echo(
                f"[{reply.id}] {reply.finish_reason}: {reply.usage.completion_tokens} tokens"
                f"{error}",
                err=True,
            )
        return ok and _all_answered(client.missing, started)


def _show(request_id: str, text: str, one: bool) -> None:
    if one:
        click.echo(text, nl=False)
        sys.stdout.flush()
    else:
        click.echo(f"[{request_id}] {text}")


def _all_answered(missing: set[str], started: float) -> bool:
    """Say on stderr which results never came (the first ten ids); True when none is missing."""
    if missing:
        click.echo(
            f"{len(missing)} result(s) missing after {time.monotonic() - started:.0f} s: "
            + ", ".join(sorted(missing)[:10]),
            err=True,
        )
    return not missing
