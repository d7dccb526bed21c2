"""`tokenmill bench`: benchmarks. Each prints a few headline lines, or its report with --json,
and writes the report to a result file with --out (JSON with the date, host and commit)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

# What every command shares (ops/bench/cli_options.py), under the short names used below.
from gpu.engine_config import EngineConfig
from ops.bench.cli_options import POSITIVE as _POSITIVE
from ops.bench.cli_options import bench_kafka as _bench_kafka
from ops.bench.cli_options import given as _given
from ops.bench.cli_options import int_option as _int
from ops.bench.cli_options import option as _opt
from ops.bench.cli_options import report_options as _report_options
from ops.bench.cli_options import run as _run
from ops.bench.cli_options import say as _say
from ops.bench.cli_options import show as _show
from ops.bench.cli_options import workload as _workload
from ops.bench.cli_options import workload_options as _workload_options
from ops.connection.options import kafka_options
from ops.models.engine_options import EngineChoice, build_engine, engine_choice, engine_options


@click.group()
def bench() -> None:
    """Benchmarks; each prints one JSON document with --json and writes it with --out."""


@bench.command("engine")
@engine_options
@_workload_options
@_int("--sequential-requests", 8, "Requests transformers runs one at a time.")
@_int("--static-batch", 16, "Batch size of transformers' static padded batches.")
@_int("--static-batches", 2, "How many static batches transformers runs.")
@_int("--gemm-size", 2048, "Side of the square matmul that measures the GEMM peak.")
@_opt("--profile", "profile_dir", type=click.Path(file_okay=False, path_type=Path),
      text="After the timed runs, profile engine steps; Chrome traces go here.")  # fmt: skip
@_int("--profile-decode-steps", 8, "Decode steps in the decode trace.")
@_opt("--workload", default="mixed",
      type=click.Choice(["mixed", "prefill-heavy", "copy", "shared-prefix", "openai-fields"]),
      text="mixed: the seeded workload against transformers (with "
      "--speculative or --speculative-model: against the engine without speculation); "
      "prefill-heavy: the same with prompts of 256-1024 tokens and outputs of 16-128 "
      "(the --min/--max lengths are ignored); copy: "
      "up to --requests rewrite, extract and code-edit prompts (chat template, greedy, up to "
      "--max-output new tokens), with speculation against without; shared-prefix: "
      "--requests requests sharing one --prefix-tokens system prompt, prefix caching on and "
      "off; openai-fields: the workload with logprobs (k = 5) against without, and n = 4 "
      "choices of --prefix-tokens prompts against 4 separate requests.")  # fmt: skip
@_int("--prefix-tokens", 512, "shared-prefix, openai-fields: tokens of the shared prompt.")
@_opt("--repeats", type=click.IntRange(min=1), text="Runs of each setting (alternating; best "
      "kept) of shared-prefix, openai-fields (default 1) and speculation (default 3).")  # fmt: skip
@_opt("--decode-roofline/--no-decode-roofline", default=None, text="Batch-1 decode against "
      "the bandwidth roofline, decode tok/s at batch 16 and 64 (default: on CUDA).")  # fmt: skip
@_int("--roofline-prompt-tokens", 128, "Decode roofline: every sequence's prompt.")
@_int("--roofline-new-tokens", 64, "Decode roofline: every sequence's new tokens.")
@_report_options
def engine(**kwargs: Any) -> None:
    """Throughput of the engine against Hugging Face transformers on one seeded workload.

    Three contenders run one after another in this process on the same random-token prompts,
    greedy and ignoring EOS: the engine (all requests at once, continuous batching),
    transformers one request at a time, and transformers in static left-padded batches (on
    subsets: rates are compared). Also: batch-1 decode and where its steps' time goes,
    TTFT/TPOT, KV blocks used, FLOP rates against a GEMM peak measured in the same run, and
    whether the targets were met. transformers is a dev dependency; without it those
    contenders are skipped. --workload shared-prefix measures prefix caching instead.

    With --speculative or --speculative-model (or --workload copy), the engine runs with
    speculative decoding and without, alternating in rounds: decode and end-to-end tokens/s
    and their ratios, acceptance, tokens per verified sequence and step, and the share of
    decode steps that speculated (`ops/bench/speculative.py`).
    """
    from ops.bench.engine import EngineBenchOptions, run_bench
    from ops.bench.shared_prefix import run_shared_prefix

    choice = engine_choice(kwargs)
    _say(f"loading {choice.model}")
    eng = build_engine(choice)
    k = kwargs
    if k["workload"] == "copy" or (k["workload"] == "mixed" and eng.config.speculation()):
        from ops.bench.speculative import run_speculative_bench

        spec_args = (k["workload"], _workload(k), k["repeats"] or 3, _say)
        return _show(_run(lambda: run_speculative_bench(eng, *spec_args)), k)
    if k["workload"] == "shared-prefix":
        args = (k["requests"], k["seed"], k["prefix_tokens"], k["repeats"] or 1, _say)
        return _show(_run(lambda: run_shared_prefix(eng, *args)), k)
    if k["workload"] == "openai-fields":
        from ops.bench.openai_fields import run_openai_fields

        fields_args = (_workload(k), k["prefix_tokens"], k["repeats"] or 1, _say)
        return _show(_run(lambda: run_openai_fields(eng, *fields_args)), k)
    workload = _workload(k)
    if k["workload"] == "prefill-heavy":
        workload = workload.prefill_heavy()
    options = _given(EngineBenchOptions, k, workload=workload)
    report = _run(lambda: run_bench(eng, options, _say))
    if k["decode_roofline"] or (k["decode_roofline"] is None and eng.model.device.type == "cuda"):
        from ops.bench.gpu_decode import DecodeOptions, run_decode_roofline

        _say("decode roofline: copy bandwidth, batch 1, batch 16 and 64")
        decode = DecodeOptions(
            k["roofline_prompt_tokens"], k["roofline_new_tokens"], seed=k["seed"]
        )
        section = report["decode_roofline"] = _run(lambda: run_decode_roofline(eng, decode))
        one = section["batch1"]
        text = f"batch 1 {one['tokens_per_s']:.1f} tok/s, {one['roofline_fraction']:.1%}"
        report.headline("decode roofline", f"{text} of the bandwidth bound")
    _show(report.finish(), k)


@bench.command("pipeline")
@engine_options
@_opt("--only", type=click.Choice(["throughput", "latency", "ceiling", "tracing", "exactly_once"]),
      multiple=True, text="Run only this section (repeatable); default: the first three. "
      "tracing: workers with tracing off and on (sampled at 1.0, into a Jaeger started for the "
      "run). exactly_once: echo workers without and with --exactly-once.")  # fmt: skip
@kafka_options
@_int("--partitions", 6, "Partitions of the run's requests and results topics.")
@_workload_options
@_int("--throughput-rounds", 3, "Throughput: rounds of a direct and a Kafka run taking turns "
      "at going first, each on the next seed; the ratio is the rounds' median.")  # fmt: skip
@_opt("--rate", type=_POSITIVE, text="Latency: requests per second (default: one per two "
      "direct p90 latencies, at most 2).")  # fmt: skip
@_int("--latency-requests", 20, "Latency: requests sent at --rate.")
@_int("--latency-max-new-tokens", 16, "Latency and tracing's model runs: new tokens each.")
@_int("--echo-requests", 20000, "Ceiling: requests to the echo worker, per prompt kind.")
@_int("--echo-prompt-tokens", 16, "Ceiling and tracing: tokens per prompt (and new tokens).")
@_int("--tracing-requests", 5000, "Tracing: echo requests per run.")
@_int("--tracing-model-requests", 48, "Tracing: requests per run to a worker on the model (0: "
      "echo only).", low=0)  # fmt: skip
@_int("--tracing-rounds", 3, "Tracing: rounds of an untraced and a traced run.")
@_int("--exactly-once-requests", 5000, "Exactly-once: echo requests per flood.")
@_int("--exactly-once-rounds", 3, "Exactly-once: rounds of a run without and one with it.")
@_int("--exactly-once-model-requests", 48, "Exactly-once: requests per run to a worker on the "
      "model (0: echo only).", low=0)  # fmt: skip
@_int("--timeout", 600, "Seconds to wait for a worker's results before counting them lost.")
@_report_options
def pipeline(**kwargs: Any) -> None:
    """The engine's workload through real Kafka and a `tokenmill worker`, against the engine.

    Starts a Kafka broker on free ports (unless --bootstrap-servers or --kafka-config give
    one) and runs the worker as a subprocess. throughput: bench engine's workload on the
    engine directly and through Kafka, in rounds taking turns: tokens/s and the rounds'
    median ratio (target ≥ 0.95). latency: short requests at a light --rate through Kafka
    against the same requests one at a time on the engine: ms added at p50 (target ≤ 10)
    and p99. ceiling: a worker with --engine echo (no model): its latency at a light rate,
    then requests/s fed as fast as this process produces, token-id and text prompts (target
    ≥ 10,000 on 2 cores). CPU seconds per process are reported beside wall times.
    """
    from ops.bench.pipeline import DEFAULT_SECTIONS, SECTIONS, PipelineOptions, run_bench

    choice = engine_choice(kwargs)
    if choice.random_weights is not None:
        raise click.UsageError("--random-weights: the pipeline's worker loads checkpoints only")
    given = {
        "engine": choice,
        "workload": _workload(kwargs),
        "sections": tuple(s for s in SECTIONS if s in kwargs["only"]) or DEFAULT_SECTIONS,
        "kafka": _bench_kafka(kwargs),
        "timeout_s": kwargs["timeout"],
    }
    options = _run(lambda: _given(PipelineOptions, kwargs, **given))
    _show(_run(lambda: run_bench(options, _say)), kwargs)


@bench.command("batch")
@_opt("--model", "-m", default="smollm2-135m",
      text="The echo worker reads this model's config and tokenizer (no weights).")  # fmt: skip
@_int("--lines", 100_000, "Lines in the large file (the small one has a tenth).")
@_int("--max-inflight", 1024, "`batch run --max-inflight`.")
@kafka_options
@_int("--partitions", 6, "Partitions of the run's requests and results topics.")
@_int("--timeout", 1800, "Seconds to wait for results (and for progress in a batch run).")
@_opt("--gateway", is_flag=True, text="Also run each file through `tokenmill gateway`'s Batch "
      "API (/v1/files, /v1/batches): its requests/s and the gateway's peak RSS.")  # fmt: skip
@_report_options
def batch_bench(**kwargs: Any) -> None:
    """`tokenmill batch run` against a raw Kafka client, and its memory as files grow.

    One `tokenmill worker --engine echo` (no model) answers the same short requests three
    times: from this process's raw aiokafka producer as fast as it goes (the baseline), then
    as OpenAI Batch lines through `tokenmill batch run` for a tenth of --lines and for
    --lines. Reports requests/s of each, their ratio, and the batch client's peak RSS for
    both sizes; with --gateway, the same for each file as a batch of a `tokenmill gateway`.
    On a broker started for the run unless --bootstrap-servers or --kafka-config give one.
    """
    from gpu.engine_config import EngineConfig
    from ops.bench.batch import BatchBenchOptions, run_batch_bench

    engine = EngineChoice(model=kwargs["model"], dtype=None, device=None, engine=EngineConfig())
    given = {"engine": engine, "kafka": _bench_kafka(kwargs), "timeout_s": kwargs["timeout"]}
    options = _given(BatchBenchOptions, kwargs, **given)
    _show(_run(lambda: run_batch_bench(options, _say)), kwargs)


@bench.command("startup")
@_opt("--model", "-m", default="smollm2-135m", text="Alias, .gguf file or HF folder.")
@_int("--rounds", 3, "Rounds of a probe, a one-token generate and a worker's start.")
@kafka_options
@_int("--timeout", 120, "Seconds each process may take.")
@_report_options
def startup_bench(**kwargs: Any) -> None:
    """How long a cold process takes to be useful, in fresh processes each round.

    A probe times the phases from inside (torch's import, tokenmill's, the loader's checkpoint,
    build, weights, kernels and digest, the engine, one token); `tokenmill generate
    --max-new-tokens 1` is timed whole; a `tokenmill worker` is timed from its spawn to its
    first `/readyz` 200 (on a broker started for the run unless --bootstrap-servers or
    --kafka-config give one). Reports every round and the medians; targets: ready and one
    token each within 5 s.
    """
    from ops.bench.startup import StartupOptions, run_startup_bench

    given = {"kafka": _bench_kafka(kwargs), "timeout_s": kwargs["timeout"]}
    options = _run(lambda: _given(StartupOptions, kwargs, **given))
    _show(_run(lambda: run_startup_bench(options, _say)), kwargs)


@bench.command("swap")
@_opt("--model", "-m", default="smollm2-135m",
      text="Alias, .gguf file or HF folder; the worker's a and b both link to it.")  # fmt: skip
@kafka_options
@_opt("--rate", type=_POSITIVE, default=1.5, text="Requests per second, on schedule (open loop).")
@_opt("--duration", type=_POSITIVE, default=45.0, text="Seconds of steady load.")
@_opt("--swap-at", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.4,
      text="When the swap command goes out, as a share of --duration.")  # fmt: skip
@_int("--max-new-tokens", 16, "New tokens per request.")
@_opt("--drain", is_flag=True, text="A 1-byte swap memory budget: a drain, not a flip.")
@_int("--timeout", 120, "Seconds to wait for the worker, the swap, and the last results.")
@_int("--min-after", 0, "Send on past --duration until this many requests went out after the "
      "swap (at most --timeout more seconds).", low=0)  # fmt: skip
@_report_options
def swap_bench(**kwargs: Any) -> None:
    """A zero-downtime model swap under steady load: latency and throughput around it.

    Runs one `tokenmill worker` on a from a temp models dir that also holds b (both hard
    links to --model, so b is a real second load of the same bytes), on a broker started
    for the run unless --bootstrap-servers or --kafka-config give one. Sends short greedy
    requests at --rate for --duration and, at --swap-at of it, a signed swap to b. Reports
    the swap's timings, and for requests sent before the command, during the swap and after
    it: latency p50/p99/max, throughput and the models that answered; then requests lost,
    duplicates, errors, p99 during/before and the throughput dip. Exits 1 when the swap
    fails.
    """
    from ops.bench.swap import SwapBenchOptions, run_swap_bench

    given = {"duration_s": kwargs["duration"], "timeout_s": kwargs["timeout"]}
    given["kafka"] = _bench_kafka(kwargs)
    options = _run(lambda: _given(SwapBenchOptions, kwargs, **given))
    report = _run(lambda: run_swap_bench(options, _say))
    _show(report, kwargs)
    if (swap := report["swap"])["outcome"] != "swapped":
        raise click.ClickException(f"the swap {swap['outcome']}: {swap['reason']}")


@bench.command("quant")
@_opt("--model", "-m", "models", multiple=True, text="Alias, HF folder or .gguf (repeatable) "
      "[smollm2-135m, and gemma3-270m when fetched].")  # fmt: skip
@_opt("--schemes", default="fp32,bf16,int8,int4,gguf,mixed", text="Comma-separated rows: fp32, "
      "bf16, int8, int4 (quantized at load), gguf (the file's own blocks), mixed (a "
      "`quantize_checkpoint` checkpoint).")  # fmt: skip
@_opt("--decode-tokens", type=click.IntRange(1, 128), default=128,
      text="Batch 1: a prompt of this many tokens, then this many new ones.")  # fmt: skip
@_int("--bf16-decode-tokens", 32, "Batch 1 for bf16 (slow on most CPUs): at most this many.")
@_int("--batch", 64, "Requests decoding together in the batched run.")
@_int("--batch-prompt-tokens", 32, "Tokens of each batched request's prompt.")
@_int("--batch-new-tokens", 32, "New tokens of each batched request.")
@_opt("--heldout", type=click.Path(dir_okay=False, path_type=Path),
      text="Text for perplexity and top-1 agreement [ops/samples/heldout.txt].")  # fmt: skip
@_opt("--mixed-from", type=click.Path(exists=True, file_okay=False, path_type=Path),
      multiple=True, text="A `tokenmill quantize` checkpoint for the mixed row, one per "
      "--model in order (default: quantize into a temporary folder).")  # fmt: skip
@_opt("--device", text="cpu | cuda (default: cuda when present).")
@_int("--seed", 0, "Seeds the prompts.", low=0)
@_report_options
def quant_bench(**kwargs: Any) -> None:
    """Each way of holding a model's weights, side by side, in one run.

    For every model and scheme: the bytes its weights hold, batch-1 decode tokens/s, the
    tokens/s of --batch requests decoding together (prefill included), perplexity over the
    held-out text and greedy top-1 agreement with fp32; each also as a ratio to the fp32
    row of the same run. Targets (int8 decode ≥ 1.6× fp32, int4 ≥ 2.5×, int8 perplexity
    within 2%) are reported, never asserted. The mixed row first quantizes the model to
    int4 with `quantize_checkpoint`'s default threshold, unless --mixed-from gives one.
    """
    from gpu.device import parse_device
    from ops.bench import quant

    models, mixed = kwargs["models"] or quant.default_models(), kwargs["mixed_from"]
    if mixed and len(mixed) != len(models):
        raise click.UsageError(
            f"{len(mixed)} --mixed-from for {len(models)} models: one per --model"
        )
    given = {
        "models": tuple(models),
        "mixed_from": dict(zip(models, mixed, strict=True)) if mixed else {},
        "device": parse_device(kwargs["device"]) if kwargs["device"] else None,
        "heldout": kwargs["heldout"] or quant.DEFAULT_HELDOUT,
    }
    try:
        given["schemes"] = quant.parse_schemes(kwargs["schemes"])
        options = _given(quant.QuantBenchOptions, kwargs, **given)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    _show(_run(lambda: quant.run_quant_bench(options, _say)), kwargs)


@bench.command("json")
@engine_options
@_opt("--batch-sizes", default="1,64", text="Comma-separated batch sizes; each runs free and "
      "constrained.")  # fmt: skip
@_int("--prompt-tokens", 32, "Random-token prompt length of every request.")
@_int("--new-tokens", 32, "Tokens every request generates (both runs hit this length).")
@_int("--seed", 0, "Seeds the prompts.", low=0)
@_report_options
def json_bench(**kwargs: Any) -> None:
    """The per-step cost of JSON-schema constraints: tokens/s with and without at each batch.

    The same seeded prompts run free and then constrained by a schema whose JSON cannot close
    within --new-tokens, so both runs generate the same number of tokens; the difference is
    the masks: the grammar library filling one bitmask per constrained row on the host, and
    their application on the device.
    """
    from ops.bench.structured import JsonBenchOptions, run_json_bench

    try:
        sizes = tuple(int(s) for s in kwargs["batch_sizes"].split(","))
    except ValueError:
        raise click.UsageError("--batch-sizes: comma-separated integers") from None
    if not sizes or min(sizes) < 1:
        raise click.UsageError("--batch-sizes: each at least 1")
    choice = engine_choice(kwargs)
    options = _given(JsonBenchOptions, kwargs, batch_sizes=sizes)
    _say(f"loading {choice.model}")
    eng = build_engine(choice)
    _show(_run(lambda: run_json_bench(eng, options)), kwargs)


@bench.command("gateway")
@engine_options
@_opt("--engine", "kind", type=click.Choice(["echo", "torch"]), default="echo",
      text="The worker's engine: echo (no model: the gateway's own ceiling) or torch (the "
      "model: is the gateway the bottleneck before the worker is?).")  # fmt: skip
@kafka_options
@_int("--partitions", 6, "Partitions of the run's requests and results topics.")
@_opt("--requests", type=click.IntRange(min=1), text="Requests per run [echo: 2000, torch: 96].")
@_int("--concurrency", 32, "Requests in flight on each path (a closed loop of this many lanes).")
@_int("--rounds", 3, "Rounds of the four runs (direct and gateway, plain and streamed), taking "
      "turns at going first.")  # fmt: skip
@_int("--prompt-tokens", 32, "Tokens of every prompt (random token ids).")
@_int("--max-output", 32, "New tokens every request asks for.")
@_int("--seed", 0, "Seeds the prompts.", low=0)
@_int("--timeout", 600, "Seconds to wait for the worker, the gateway and each result.")
@_report_options
def gateway_bench(**kwargs: Any) -> None:
    """What `tokenmill gateway` adds: HTTP → Kafka → HTTP against a Kafka client, one run.

    One `tokenmill worker` (--engine echo: no model; torch: --model) on a broker started for
    the run (unless --bootstrap-servers or --kafka-config give one) is driven four ways in
    --rounds rounds, taking turns at going first: direct, this process producing the requests
    to Kafka and reading the results; and through a `tokenmill gateway` subprocess, the same
    requests as POST /v1/completions bodies over keep-alive HTTP/1.1; and both again with
    `stream: true`. Each path keeps --concurrency requests in flight. Reports requests/s,
    latency p50/p99 (streamed: to the first text and to the end) and the latency the gateway
    adds at each (goal: at most 5 ms at p50), the median of the rounds' throughput ratios
    (gateway / direct; with torch, target ≥ 0.95: the gateway is not the bottleneck), and
    CPU seconds per process (client, gateway, worker and broker share this host's CPUs).
    """
    from ops.bench.gateway import GatewayBenchOptions, run_gateway_bench

    if kwargs["model"] is None and kwargs["random_weights"] is None:
        kwargs["model"] = "smollm2-135m"
    choice = engine_choice(kwargs)
    if choice.random_weights is not None:
        raise click.UsageError("--random-weights: the worker loads checkpoints only")
    given = {"engine": choice, "kafka": _bench_kafka(kwargs), "timeout_s": kwargs["timeout"]}
    options = _given(GatewayBenchOptions, kwargs, **given)
    _show(_run(lambda: run_gateway_bench(options, _say)), kwargs)


@bench.command("embed")
@_opt("--model", "-m", default="embeddinggemma-300m", text="Alias or sentence-transformers "
      "folder of an embedding model.")  # fmt: skip
@_int("--texts", 1000, "Texts embedded in each timed run (seeded, mixed lengths).")
@_int("--seed", 0, "Seeds the texts (the batch-size sample uses the next seed).", low=0)
@_int("--rounds", 2, "Timed runs of each contender, alternating.")
@_opt("--batch-sizes", default="8,16,32,64", text="sentence-transformers' batch sizes to try; "
      "the fastest on --sample texts runs the rounds.")  # fmt: skip
@_int("--sample", 100, "Texts of the batch-size sweep.")
@_int("--max-num-batched-tokens", EngineConfig().max_num_batched_tokens,
      "tokenmill's token budget per step (the worker's default).")  # fmt: skip
@_opt("--prompt-name", text="A task prompt of the model's (query, document, …) on every text.")
@_opt("--device", default="cpu", text="cpu | cuda, for tokenmill and sentence-transformers.")
@_opt("--direct", is_flag=True, text="Also time the encoder's synchronous `encode` path.")
@_opt("--vllm-python", type=click.Path(exists=True, dir_okay=False, path_type=Path),
      text="An interpreter with vLLM installed (e.g. the peer bench's ~/.cache/tokenmill-peers/"
      "vllm/bin/python): vLLM embeds the texts too, in a child process.")  # fmt: skip
@_report_options
def embed_bench(**kwargs: Any) -> None:
    """Texts/s and tokens/s of tokenmill's encoder against sentence-transformers (and vLLM).

    --texts seeded texts, from one-sentence queries to documents over 512 tokens, are embedded
    from text to vectors (tokenizing included) on the same folder and CPU threads: by
    tokenmill's encoder engine driven as the worker drives it (one request per text, steps
    packed to --max-num-batched-tokens), and by sentence-transformers' `encode` at its fastest
    of --batch-sizes; with --vllm-python, also by vLLM's pooling runner. The contenders take
    turns over --rounds rounds; the best run of each counts. Reports the rates, tokenmill's
    ratio to each (targets: ≥ 2× sentence-transformers, ≥ 1.2× vLLM) and the cosine agreement
    of their vectors with tokenmill's (target: min ≥ 0.9999).
    """
    from ops.bench.embed import EmbedBenchOptions, run_embed_bench

    try:
        sizes = tuple(int(s) for s in kwargs["batch_sizes"].split(","))
    except ValueError:
        raise click.UsageError("--batch-sizes: comma-separated integers") from None
    if not sizes or min(sizes) < 1:
        raise click.UsageError("--batch-sizes: each at least 1")
    options = _given(EmbedBenchOptions, kwargs, batch_sizes=sizes)
    _show(_run(lambda: run_embed_bench(options, _say)), kwargs)
