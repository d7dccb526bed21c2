"""`tokenmill batch run|status|show|cancel`: OpenAI Batch JSONL files through Kafka, resumable."""

from __future__ import annotations

import asyncio
import json
import math
import sys
from pathlib import Path
from typing import Any

import click

from actors.config import DEFAULT_CANCEL_TOPIC, DEFAULT_REQUESTS_TOPIC, DEFAULT_RESULTS_TOPIC
from ops.connection.options import kafka_connection, kafka_options


@click.group()
def batch() -> None:
    """Offline generation and embedding from OpenAI Batch API JSONL files."""


@batch.command()
@kafka_options
@click.argument("input_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Output JSONL. An existing one is resumed: lines it answers are skipped.",
)
@click.option("--max-inflight", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--model", default=None, help="Run every line on this model (overrides bodies).")
@click.option(
    "--default-max-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="For bodies without max_tokens, chats too (default: 16, as OpenAI's completions).",
)
@click.option(
    "--openai-defaults",
    is_flag=True,
    help="Omitted fields mean what they mean to OpenAI (as the gateway reads them): a chat "
    "without max_tokens runs to EOS, and temperature, top_p and top_k take the model's "
    "recommended values. Without it, the wire's deterministic defaults: greedy, 16 tokens.",
)
@click.option("--topic", default=DEFAULT_REQUESTS_TOPIC, show_default=True)
@click.option("--results-topic", default=DEFAULT_RESULTS_TOPIC, show_default=True)
@click.option(
    "--cancel-topic",
    default=DEFAULT_CANCEL_TOPIC,
    show_default=True,
    help="Where `batch cancel` sends the cancels of the requests in flight.",
)
@click.option(
    "--cancel-wait",
    type=click.FloatRange(min=0),
    callback=lambda _ctx, _param, value: _finite(value),
    default=30.0,
    show_default=True,
    help="After `batch cancel`: seconds to wait for the workers' cancelled answers; what is "
    "still unanswered then is written as cancelled (no tokens).",
)
@click.option(
    "--stall-timeout",
    type=click.FloatRange(min=0, min_open=True),
    callback=lambda _ctx, _param, value: _finite(value),
    default=300.0,
    show_default=True,
    help="Give up (exit 1, resumable) when nothing is answered for this many seconds.",
)
@click.option(
    "--progress/--no-progress",
    default=None,
    help="A progress bar, or nothing (default: a bar on a terminal, a line every 10 s if not).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
def run(input_file: Path, output: Path, as_json: bool, **kwargs: Any) -> None:
    """Run every line of INPUT_FILE (OpenAI Batch API JSONL) and write OUTPUT lines.

    Needs a running worker (`tokenmill worker`) on the same topics. Each input line gets
    exactly one output line, in the order results arrive: `response` (status 200 with a
    completion, a chat completion or an embeddings list, or the worker's refusal) or `error`
    (a line that never became a request, with its line number). `/v1/embeddings` lines need a
    worker that serves an embedding model. Interrupted (Ctrl-C, kill): rerun the same
    command to finish it; nothing answered is asked again and no line is written twice.
    Exit 0 when every line is answered, 1 when the run stopped early.
    """
    from aiokafka.errors import KafkaError

    from ops.batch.progress import progress_for
    from ops.batch.runner import BatchOptions, run_batch
    from ops.errors import BatchOutputBusy, SubmitError
    from ops.worker.telemetry import setup_tracing, shutdown_tracing

    if output.resolve() == input_file.resolve():
        raise click.UsageError("the output file must not be the input file")
    options = BatchOptions(
        input=input_file,
        output=output,
        kafka=kafka_connection(kwargs),
        topic=kwargs["topic"],
        results_topic=kwargs["results_topic"],
        max_inflight=kwargs["max_inflight"],
        model=kwargs["model"],
        default_max_tokens=kwargs["default_max_tokens"],
        openai_defaults=kwargs["openai_defaults"],
        stall_timeout_s=kwargs["stall_timeout"],
        cancel_topic=kwargs["cancel_topic"],
        cancel_wait_s=kwargs["cancel_wait"],
    )
    try:
        tracing = setup_tracing("tokenmill-cli")
        try:
            summary = asyncio.run(run_batch(options, progress_for(kwargs["progress"])))
        finally:
            shutdown_tracing(tracing)
    except BatchOutputBusy as exc:
        raise click.ClickException(str(exc)) from exc
    except (SubmitError, KafkaError, OSError) as exc:
        raise click.ClickException(f"{exc}; rerun the same command to resume") from exc
    except KeyboardInterrupt:
        click.echo(f"interrupted: rerun the same command to finish {output}", err=True)
        sys.exit(130)
    if as_json:
        click.echo(json.dumps(summary.as_json(), indent=2))
    else:
        _print_summary(summary.as_json())
    if summary.cancel_requested:
        click.echo(
            f"cancelled: {summary.cancelled} in-flight lines written as cancelled; rerun the "
            "same command to run the lines not sent yet",
            err=True,
        )
    if summary.stalled:
        click.echo(
            f"stopped: nothing answered for {options.stall_timeout_s:.0f} s "
            "(is a worker running on these topics?); rerun to resume",
            err=True,
        )
    sys.exit(0 if summary.complete else 1)


@batch.command()
@click.argument("output", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--input",
    "input_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The run's input file, to show how much is left.",
)
@click.option("--json", "as_json", is_flag=True)
def status(output: Path, input_file: Path | None, as_json: bool) -> None:
    """How far a run has got, read from its OUTPUT file (safe while it runs)."""
    from ops.batch.output import read_answered
    from ops.batch.summary import count_lines

    answered = read_answered(output)
    report: dict[str, Any] = {
        "output": str(output),
        "answered": answered.lines,
        "ok": answered.ok,
        "refused": sum(n for code, n in answered.by_status.items() if code != 200),
        "line_errors": sum(answered.line_errors.values()),
        "by_status": {str(code): n for code, n in sorted(answered.by_status.items())},
        "line_errors_by_code": dict(sorted(answered.line_errors.items())),
        "prompt_tokens": answered.prompt_tokens,
        "completion_tokens": answered.completion_tokens,
    }
    if input_file is not None:
        total = count_lines(input_file)
        report |= {"total_lines": total, "left": max(total - answered.lines, 0)}
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    of_total = f" of {report['total_lines']}" if input_file is not None else ""
    click.echo(
        f"{output}: {answered.lines}{of_total} answered: {report['ok']} ok, "
        f"{report['refused']} refused by the worker, {report['line_errors']} bad lines; "
        f"{answered.completion_tokens} completion tokens"
    )
    if input_file is not None:
        click.echo(f"{report['left']} left; `tokenmill batch run` with the same -o resumes")


@batch.command()
@click.argument("output", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
def show(output: Path, limit: int) -> None:
    """Print an OUTPUT file as a table: custom_id, answer or error, finish reason, tokens."""
    from ops.batch.table import print_table

    print_table(output, limit)


@batch.command("cancel")
@click.argument("output", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(min=0, min_open=True),
    default=120.0,
    show_default=True,
    help="Seconds to wait for the run to write its cancelled lines and exit.",
)
def cancel(output: Path, wait_s: float) -> None:
    """Cancel the running `batch run` that writes OUTPUT.

    The run stops reading its input, cancels every request it has in flight (each worker
    holding one stops it), writes their lines with `tokenmill.finish_reason` `cancelled`
    and the tokens made so far, and exits. Lines it had not sent stay unanswered: rerun the same
    `batch run` command to run them. Exit 1 when no run writes OUTPUT.
    """
    from ops.batch.cancel import request_cancel

    try:
        stopped = request_cancel(output, wait_s)
    except TimeoutError as exc:
        raise click.ClickException(str(exc)) from exc
    if not stopped:
        raise click.ClickException(f"no `tokenmill batch run` is writing {output}")
    click.echo(f"{output}: the run stopped; its in-flight lines are written as cancelled")


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise click.BadParameter("must be a finite number of seconds")
    return value


def _print_summary(summary: dict[str, Any]) -> None:
    state = "complete" if summary["complete"] else "incomplete"
    click.echo(
        f"batch {state}: {summary['answered']} answered this run "
        f"({summary['ok']} ok, {summary['refused']} refused, {summary['line_errors']} bad lines)"
        f", {summary['already_answered']} already answered, of {summary['total_lines']} lines"
    )
    if summary["errors_by_code"]:
        codes = ", ".join(f"{code} {n}" for code, n in summary["errors_by_code"].items())
        click.echo(f"errors: {codes}")
    vectors = f", {summary['embeddings']} embeddings" if summary["embeddings"] else ""
    click.echo(
        f"tokens: {summary['prompt_tokens']} prompt, {summary['completion_tokens']} completion"
        f"{vectors}; {summary['wall_s']:.1f} s, {summary['requests_per_s']:.1f} req/s, "
        f"{summary['completion_tokens_per_s']:.1f} tok/s"
    )
    click.echo(f"output: {summary['output']}")
