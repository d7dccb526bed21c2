"""`tokenmill bench`: benchmarks that report JSON (`--json`) or a short summary."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import click

from actors.kafka.connection import KafkaConnection
from ops.bench.summaries import pipeline_summary, shared_prefix_summary, summary, swap_summary
from ops.connection.options import kafka_connection, kafka_options
from ops.errors import OpsError
from ops.models.engine_options import build_engine, engine_choice, engine_options


@click.group()
def bench() -> None:
    """Benchmarks; each prints one JSON document with --json."""


def _positive(name: str, default: int, text: str) -> Callable[[Callable[..., Any]], Any]:
    return click.option(
        name, type=click.IntRange(min=1), default=default, show_default=True, help=text
    )


def _bench_kafka(kwargs: dict[str, Any]) -> KafkaConnection | None:
    """The broker the user gave (`--bootstrap-servers` or `--kafka-config`, or their env vars)
    with the rest of the connection options; None: start a plaintext one for the run. Other
    connection settings without a broker to apply to are a usage error, not silently dropped."""
    given = kwargs["bootstrap_servers"] is not None or kwargs["kafka_config"] is not None
    kafka = kafka_connection(kwargs)
    if given:
        return kafka
    stray = [f.name for f in fields(kafka) if getattr(kafka, f.name) != getattr(_NOT_GIVEN, f.name)]
    if stray:
        raise click.UsageError(
            f"{', '.join(stray)} given without --bootstrap-servers or --kafka-config: "
            "without them the bench starts its own plaintext broker"
        )
    return None


_NOT_GIVEN = KafkaConnection()


def _workload_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The seeded workload's shape, the same for `bench engine` and `bench pipeline`."""
    options = [
        _positive("--requests", 64, "Requests in the (throughput) workload."),
        click.option("--seed", type=int, default=0, show_default=True, help="Seeds the workload."),
        _positive("--min-prompt", 16, "Shortest prompt, in tokens."),
        _positive("--max-prompt", 256, "Longest prompt, in tokens."),
        _positive("--min-output", 16, "Shortest output, in tokens."),
        _positive("--max-output", 256, "Longest output, in tokens."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


@bench.command("engine")
@engine_options
@_workload_options
@_positive("--sequential-requests", 8, "Requests transformers runs one at a time.")
@_positive("--static-batch", 16, "Batch size of transformers' static padded batches.")
@_positive("--static-batches", 2, "How many static batches transformers runs.")
@_positive("--gemm-size", 2048, "Side of the square matmul that measures the GEMM peak.")
@click.option(
    "--profile",
    "profile_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="After the timed runs, profile engine steps; Chrome traces (Perfetto) go here.",
)
@_positive("--profile-decode-steps", 8, "Decode steps in the decode trace.")
@click.option(
    "--workload",
    type=click.Choice(["mixed", "shared-prefix"]),
    default="mixed",
    show_default=True,
    help="mixed: the seeded workload against transformers; shared-prefix: --requests "
    "requests sharing one --prefix-tokens system prompt, run with prefix caching on and off.",
)
@_positive("--prefix-tokens", 512, "shared-prefix: tokens of the shared system prompt.")
@_positive("--repeats", 1, "shared-prefix: runs of each setting (alternating; best kept).")
@click.option(
    "--decode-roofline/--no-decode-roofline",
    default=None,
    help="Batch-1 decode against the memory-bandwidth roofline and decode tok/s at batch 16 "
    "and 64 (default: on CUDA only; elsewhere timed with perf_counter against a host memcpy).",
)
@_positive("--roofline-prompt-tokens", 128, "Decode roofline: every sequence's prompt.")
@_positive("--roofline-new-tokens", 64, "Decode roofline: every sequence's new tokens.")
@click.option("--json", "as_json", is_flag=True, help="Print the full report as JSON.")
def engine(**kwargs: Any) -> None:
    """Throughput of the engine against Hugging Face transformers on one seeded workload.

    Three contenders run one after another in this process on the same random-token prompts,
    greedy and ignoring EOS, so each generates exactly the asked number of tokens: the engine
    (all requests at once, continuous batching), transformers one request at a time, and
    transformers in static left-padded batches. The transformers runs use subsets, so rates
    (output tokens/s) are compared. Also reported: TTFT/TPOT percentiles, KV blocks used,
    model FLOP rates against a measured GEMM peak, and whether the targets were met.
    transformers is a dev dependency; without it those contenders are skipped.
    """
    from ops.bench.engine import dumps, run_bench
    from ops.bench.workload import BenchOptions

    choice = engine_choice(kwargs)
    options = BenchOptions(
        requests=kwargs["requests"],
        seed=kwargs["seed"],
        min_prompt=kwargs["min_prompt"],
        max_prompt=kwargs["max_prompt"],
        min_output=kwargs["min_output"],
        max_output=kwargs["max_output"],
        sequential_requests=kwargs["sequential_requests"],
        static_batch=kwargs["static_batch"],
        static_batches=kwargs["static_batches"],
        gemm_size=kwargs["gemm_size"],
        profile_dir=kwargs["profile_dir"],
        profile_decode_steps=kwargs["profile_decode_steps"],
    )
    click.echo(f"loading {choice.model}", err=True)
    eng = build_engine(choice)
    if kwargs["workload"] == "shared-prefix":
        _shared_prefix(eng, options, kwargs)
        return
    try:
        report = run_bench(eng, options, progress=lambda line: click.echo(line, err=True))
        roofline = kwargs["decode_roofline"]
        if roofline or (roofline is None and eng.model.device.type == "cuda"):
            report["decode_roofline"] = _decode_roofline(eng, kwargs)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    if kwargs["as_json"]:
        click.echo(dumps(report))
    else:
        click.echo(summary(report))
    if report["profile"]:
        for phase in report["profile"].values():
            click.echo(f"trace: {phase['trace']}", err=True)


def _decode_roofline(eng: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    from ops.bench.gpu_decode import DecodeOptions, run_decode_roofline

    click.echo("decode roofline: copy bandwidth, batch 1, batch 16 and 64", err=True)
    options = DecodeOptions(
        prompt_tokens=kwargs["roofline_prompt_tokens"],
        new_tokens=kwargs["roofline_new_tokens"],
        seed=kwargs["seed"],
    )
    return run_decode_roofline(eng, options)


def _shared_prefix(eng: Any, options: Any, kwargs: dict[str, Any]) -> None:
    from ops.bench.engine import dumps
    from ops.bench.shared_prefix import run_shared_prefix

    try:
        report = run_shared_prefix(
            eng,
            options,
            prefix_tokens=kwargs["prefix_tokens"],
            repeats=kwargs["repeats"],
            progress=lambda line: click.echo(line, err=True),
        )
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(dumps(report) if kwargs["as_json"] else shared_prefix_summary(report))


@bench.command("pipeline")
@engine_options
@click.option(
    "--only",
    type=click.Choice(["throughput", "latency", "ceiling", "tracing"]),
    multiple=True,
    help="Run only this section (repeatable); default: the first three. tracing: an echo "
    "worker with tracing off and on (sampled at 1.0, into a Jaeger started for the run).",
)
@kafka_options
@_positive("--partitions", 6, "Partitions of the run's requests and results topics.")
@_workload_options
@_positive(
    "--throughput-rounds",
    3,
    "Throughput: rounds of a direct and a Kafka run, taking turns at going first; each round "
    "on the next seed's workload. The ratio reported is the rounds' median.",
)
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Latency: requests per second (default: light for the engine, one per two direct "
    "p90 latencies, at most 2).",
)
@_positive("--latency-requests", 20, "Latency: requests sent at --rate.")
@_positive("--latency-max-new-tokens", 16, "Latency: new tokens per request.")
@_positive("--echo-requests", 20000, "Ceiling: requests to the echo worker, per prompt kind.")
@_positive("--echo-prompt-tokens", 16, "Ceiling: tokens per prompt (and new tokens).")
@_positive("--tracing-requests", 5000, "Tracing: echo requests per run (off, on, off, on).")
@click.option(
    "--tracing-model-requests",
    type=click.IntRange(min=0),
    default=48,
    show_default=True,
    help="Tracing: requests per run to a worker on the model, with --latency-max-new-tokens "
    "new tokens each (0: echo only).",
)
@_positive("--timeout", 600, "Seconds to wait for a worker's results before counting them lost.")
@click.option("--json", "as_json", is_flag=True, help="Print the full report as JSON.")
def pipeline(**kwargs: Any) -> None:
    """The engine's workload through real Kafka and a `tokenmill worker`, against the engine.

    Starts a Kafka broker on free ports (unless --bootstrap-servers or --kafka-config give one,
    with the other connection options), makes topics for this run, and runs the worker as a
    subprocess. throughput: bench engine's seeded workload on the engine directly and through
    Kafka, in --throughput-rounds taking turns: output tokens/s and the rounds' median ratio
    (target ≥ 0.95).
    latency: short requests at a light --rate through Kafka, end to end, against the same
    requests one at a time on the engine: ms added at p50 (target ≤ 10) and p99. ceiling: a
    worker with --engine echo (no model): its latency at a light rate (the plumbing's floor),
    then requests/s when fed as fast as this process produces, with token-id and with text
    prompts (target ≥ 10,000 on 2 cores, broker on the same machine). CPU seconds of the
    worker, this process and the broker are reported beside wall times: on a busy host they
    say more.
    """
    import asyncio

    from gpu.errors import EngineError
    from ops.bench.engine import dumps
    from ops.bench.pipeline import run_bench
    from ops.bench.pipeline_run import DEFAULT_SECTIONS, SECTIONS, PipelineOptions
    from ops.bench.workload import BenchOptions

    choice = engine_choice(kwargs)
    if choice.random_weights is not None:
        raise click.UsageError(
            "--random-weights: the pipeline's worker loads checkpoints only (use bench engine)"
        )
    try:
        options = PipelineOptions(
            engine=choice,
            workload=BenchOptions(
                requests=kwargs["requests"],
                seed=kwargs["seed"],
                min_prompt=kwargs["min_prompt"],
                max_prompt=kwargs["max_prompt"],
                min_output=kwargs["min_output"],
                max_output=kwargs["max_output"],
            ),
            sections=tuple(s for s in SECTIONS if s in kwargs["only"]) or DEFAULT_SECTIONS,
            kafka=_bench_kafka(kwargs),
            partitions=kwargs["partitions"],
            throughput_rounds=kwargs["throughput_rounds"],
            rate=kwargs["rate"],
            latency_requests=kwargs["latency_requests"],
            latency_max_new_tokens=kwargs["latency_max_new_tokens"],
            echo_requests=kwargs["echo_requests"],
            echo_prompt_tokens=kwargs["echo_prompt_tokens"],
            tracing_requests=kwargs["tracing_requests"],
            tracing_model_requests=kwargs["tracing_model_requests"],
            timeout_s=kwargs["timeout"],
        )
        report = asyncio.run(run_bench(options, progress=lambda line: click.echo(line, err=True)))
    except (ValueError, RuntimeError, OpsError, EngineError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(dumps(report) if kwargs["as_json"] else pipeline_summary(report))


@bench.command("batch")
@click.option(
    "--model",
    "-m",
    default="smollm2-135m",
    show_default=True,
    help="The echo worker reads this model's config and tokenizer (no weights).",
)
@_positive("--lines", 100_000, "Lines in the large file (the small one has a tenth).")
@_positive("--max-inflight", 1024, "`batch run --max-inflight`.")
@kafka_options
@_positive("--partitions", 6, "Partitions of the run's requests and results topics.")
@_positive("--timeout", 1800, "Seconds to wait for results (and for progress in a batch run).")
@click.option("--json", "as_json", is_flag=True, help="Print the full report as JSON.")
def batch_bench(**kwargs: Any) -> None:
    """`tokenmill batch run` against a raw Kafka client, and its memory as files grow.

    One `tokenmill worker --engine echo` (no model) answers the same short requests three
    times: from this process's raw aiokafka producer as fast as it goes (the baseline), then as
    OpenAI Batch lines through `tokenmill batch run` subprocesses for a tenth of --lines and
    for --lines. Reports requests/s of each, their ratio, and the batch client's peak RSS for
    both file sizes (bounded memory: the large file's peak should barely exceed the small's).
    On a broker started for the run unless --bootstrap-servers or --kafka-config give one.
    """
    import asyncio

    from gpu.engine_config import EngineConfig
    from ops.bench.batch import BatchBenchOptions, run_batch_bench
    from ops.bench.engine import dumps
    from ops.models.engine_options import EngineChoice

    options = BatchBenchOptions(
        engine=EngineChoice(model=kwargs["model"], dtype=None, device=None, engine=EngineConfig()),
        lines=kwargs["lines"],
        max_inflight=kwargs["max_inflight"],
        kafka=_bench_kafka(kwargs),
        partitions=kwargs["partitions"],
        timeout_s=kwargs["timeout"],
    )
    try:
        report = asyncio.run(run_batch_bench(options, lambda line: click.echo(line, err=True)))
    except (RuntimeError, OpsError) as exc:
        raise click.ClickException(str(exc)) from exc
    r = report["results"]
    click.echo(
        dumps(report)
        if kwargs["as_json"]
        else (
            f"raw client {r['baseline_requests_per_s']} req/s · batch run "
            f"{r['batch_requests_per_s']} req/s · ratio {r['batch_vs_raw_client']}\n"
            f"batch client peak RSS {r['peak_rss_mb']['small']} MB ({report['small_lines']} "
            f"lines) → {r['peak_rss_mb']['large']} MB ({report['lines']} lines)"
        )
    )


@bench.command("swap")
@click.option(
    "--model",
    "-m",
    default="smollm2-135m",
    show_default=True,
    help="Alias or .gguf file; the worker's a.gguf and b.gguf are both links to it.",
)
@kafka_options
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    default=1.5,
    show_default=True,
    help="Requests per second, sent on schedule (open loop); light enough for SmolLM2 on 2 CPUs.",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0, min_open=True),
    default=45.0,
    show_default=True,
    help="Seconds of steady load.",
)
@click.option(
    "--swap-at",
    type=click.FloatRange(min=0, max=1, min_open=True, max_open=True),
    default=0.4,
    show_default=True,
    help="When the swap command goes out, as a share of --duration.",
)
@_positive("--max-new-tokens", 16, "New tokens per request.")
@click.option(
    "--drain",
    is_flag=True,
    help="Give the worker a 1-byte swap memory budget: a drain-mode swap, not a flip.",
)
@_positive("--timeout", 120, "Seconds to wait for the worker, the swap, and the last results.")
@click.option(
    "--min-after",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Keep sending past --duration until this many requests went out after the swap "
    "(at most --timeout more seconds): a slow swap still has an after window.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the full report as JSON.")
def swap_bench(**kwargs: Any) -> None:
    """A zero-downtime model swap under steady load: latency and throughput around it.

    Runs one `tokenmill worker` on a.gguf from a temp models dir that also holds b.gguf (both
    hard links to --model's file, so b is a real second load of the same bytes), on a broker
    started for the run unless --bootstrap-servers or --kafka-config give one. Sends short
    greedy requests at --rate for --duration and, at --swap-at of it, a signed swap to b.gguf.
    Reports the swap's timings (load, smoke test, flip or drain pause), and for requests sent
    before the command, during the swap and after it: latency p50/p99/max, throughput and the
    models that answered; then requests lost, duplicates, errors, p99 during/before and the
    throughput dip (slowest 1-s bin around the swap over the mean before it). Exits 1 when the
    swap fails.
    """
    import asyncio

    from ops.bench.engine import dumps
    from ops.bench.swap import SwapBenchOptions, run_swap_bench

    try:
        options = SwapBenchOptions(
            model=kwargs["model"],
            rate=kwargs["rate"],
            duration_s=kwargs["duration"],
            swap_at=kwargs["swap_at"],
            max_new_tokens=kwargs["max_new_tokens"],
            drain=kwargs["drain"],
            kafka=_bench_kafka(kwargs),
            timeout_s=kwargs["timeout"],
            min_after=kwargs["min_after"],
        )
        report = asyncio.run(run_swap_bench(options, lambda line: click.echo(line, err=True)))
    except (ValueError, RuntimeError, OpsError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(dumps(report) if kwargs["as_json"] else swap_summary(report))
    swap = report["swap"]
    if swap["outcome"] != "swapped":
        raise click.ClickException(f"the swap {swap['outcome']}: {swap['reason']}")


@bench.command("quant")
@click.option(
    "--model",
    "-m",
    "models",
    multiple=True,
    help="Alias, HF folder or .gguf (repeatable) [smollm2-135m, and gemma3-270m when fetched].",
)
@click.option(
    "--schemes",
    default="fp32,bf16,int8,int4,gguf,mixed",
    show_default=True,
    help="Comma-separated rows: fp32, bf16 (no quantization), int8, int4 (quantized at load), "
    "gguf (the file's own blocks kept quantized), mixed (a `quantize_checkpoint` checkpoint).",
)
@click.option(
    "--decode-tokens",
    type=click.IntRange(1, 128),
    default=128,
    show_default=True,
    help="Batch 1: a prompt of this many tokens, then this many new ones.",
)
@_positive("--bf16-decode-tokens", 32, "Batch 1 for bf16 (slow on most CPUs): at most this many.")
@_positive("--batch", 64, "Requests decoding together in the batched run.")
@_positive("--batch-prompt-tokens", 32, "Tokens of each batched request's prompt.")
@_positive("--batch-new-tokens", 32, "New tokens of each batched request.")
@click.option(
    "--heldout",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Text for perplexity and top-1 agreement [ops/samples/heldout.txt].",
)
@click.option(
    "--mixed-from",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    multiple=True,
    help="A `tokenmill quantize` checkpoint for the mixed row instead of quantizing into a "
    "temporary folder; repeatable, one per --model, in the same order.",
)
@click.option("--device", default=None, help="cpu | cuda (default: cuda when present).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds the prompts.")
@click.option("--json", "as_json", is_flag=True, help="Print the full report as JSON.")
def quant_bench(**kwargs: Any) -> None:
    """Each way of holding a model's weights, side by side, in one run.

    For every model and scheme: the bytes its weights hold in memory, batch-1 decode tokens/s
    (bench engine's batch 1), the tokens/s of --batch requests decoding together (bench
    engine's engine run, prefill included), perplexity over the held-out text and greedy top-1
    agreement with fp32 there (the text fed in; each position's most likely next token); each
    also as a ratio to the fp32 row of the same run. Targets (int8 decode ≥ 1.6× fp32, int4 ≥
    2.5×, int8 perplexity within 2%) are reported, never asserted. Rows run one after another
    in this process; the mixed row first quantizes the model to int4 with
    `quantize_checkpoint`'s default threshold, unless --mixed-from gives a checkpoint.
    """
    from gpu.device import parse_device
    from gpu.errors import EngineError
    from ops.bench.engine import dumps
    from ops.bench.quant import QuantBenchOptions, default_models, parse_schemes, run_quant_bench
    from ops.bench.quant_table import quant_table

    models = kwargs["models"] or default_models()
    mixed = kwargs["mixed_from"]
    if mixed and len(mixed) != len(models):
        raise click.UsageError(
            f"{len(mixed)} --mixed-from for {len(models)} models: give one per --model"
        )
    try:
        options = QuantBenchOptions(
            models=tuple(models),
            schemes=parse_schemes(kwargs["schemes"]),
            decode_tokens=kwargs["decode_tokens"],
            bf16_decode_tokens=kwargs["bf16_decode_tokens"],
            batch=kwargs["batch"],
            batch_prompt_tokens=kwargs["batch_prompt_tokens"],
            batch_new_tokens=kwargs["batch_new_tokens"],
            mixed_from=dict(zip(models, mixed, strict=True)) if mixed else {},
            device=parse_device(kwargs["device"]) if kwargs["device"] else None,
            seed=kwargs["seed"],
            **({"heldout": kwargs["heldout"]} if kwargs["heldout"] else {}),
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        report = run_quant_bench(options, progress=lambda line: click.echo(line, err=True))
    except (ValueError, RuntimeError, OpsError, EngineError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(dumps(report) if kwargs["as_json"] else quant_table(report))


@bench.command("json")
@engine_options
@click.option(
    "--batch-sizes",
    default="1,64",
    show_default=True,
    help="Comma-separated batch sizes; each runs free and constrained.",
)
@_positive("--prompt-tokens", 32, "Random-token prompt length of every request.")
@_positive("--new-tokens", 32, "Tokens every request generates (both runs hit this length).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds the prompts.")
@click.option("--json", "as_json", is_flag=True, help="Print the full report as JSON.")
def json_bench(**kwargs: Any) -> None:
    """The per-step cost of JSON-schema constraints: tokens/s with and without at each batch.

    The same seeded prompts run free and then constrained by a schema whose JSON cannot close
    within `--new-tokens`, so both runs generate the same number of tokens; the difference is
    the masks: the grammar library filling one bitmask per constrained row on the host, and
    their application on the device.
    """
    from ops.bench.engine import dumps
    from ops.bench.structured import JsonBenchOptions, json_summary, run_json_bench

    try:
        sizes = tuple(int(s) for s in kwargs["batch_sizes"].split(","))
    except ValueError:
        raise click.UsageError("--batch-sizes: comma-separated integers") from None
    if not sizes or min(sizes) < 1:
        raise click.UsageError("--batch-sizes: each at least 1")
    choice = engine_choice(kwargs)
    options = JsonBenchOptions(
        batch_sizes=sizes,
        prompt_tokens=kwargs["prompt_tokens"],
        new_tokens=kwargs["new_tokens"],
        seed=kwargs["seed"],
    )
    click.echo(f"loading {choice.model}", err=True)
    report = run_json_bench(build_engine(choice), options)
    click.echo(dumps(report) if kwargs["as_json"] else json_summary(report))
