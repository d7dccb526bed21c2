"""WorkerMetrics: what the actors report comes out of `render()` under the contract's names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from actors.telemetry.gpu_utilization import GpuUtilization
from actors.telemetry.metrics import WorkerMetrics
from gpu.engine import StepStats
from messages.error_codes import ErrorCode
from messages.result import ErrorInfo, FinishReason, GenerateResult, Timings, Usage

README = Path(__file__).resolve().parents[4] / "compose" / "README.md"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(metrics: WorkerMetrics) -> Samples:
    """Every sample of a render, keyed by (sample name, sorted labels)."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def exposed_names(metrics: WorkerMetrics) -> set[str]:
    """Metric names as a query writes them (a counter with its `_total`)."""
    names = set()
    for family in text_string_to_metric_families(metrics.render().decode()):
        names.add(family.name)
        if family.type == "counter":
            names.add(family.name + "_total")
    return names


def finished(
    *,
    reason: FinishReason = FinishReason.STOP,
    prompt: int = 5,
    completion: int = 3,
    timings: Timings | None = None,
    error: ErrorCode | None = None,
) -> GenerateResult:
    return GenerateResult(
        id="r1",
        finish_reason=reason,
        usage=Usage(
            prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
        ),
        timings=timings or Timings(),
        error=None if error is None else ErrorInfo(code=error, message="no"),
    )


def step(**overrides: int) -> StepStats:
    fields = {
        "start_ns": 1_000_000_000,
        "end_ns": 1_020_000_000,  # 20 ms
        "num_seqs": 2,
        "num_prefill_tokens": 10,
        "num_decode_tokens": 2,
        "num_preempted": 0,
        "num_waiting": 1,
        "num_running": 2,
        "kv_blocks_used": 30,
        "kv_blocks_total": 120,
    }
    return StepStats(**(fields | overrides))


def test_every_metric_of_the_dashboard_contract_is_exposed() -> None:
    rows = [line for line in README.read_text().splitlines() if line.startswith("| `tokenmill_")]
    contract = {re.match(r"\| `(tokenmill_[a-z_]+)`", row)[1] for row in rows}  # type: ignore[index]
    assert len(contract) >= 14
    missing = contract - exposed_names(WorkerMetrics())
    assert not missing, f"/metrics lacks {sorted(missing)}"


def test_operator_metrics_are_exposed_too() -> None:
    names = exposed_names(WorkerMetrics())
    assert {
        "tokenmill_prompt_tokens_total",
        "tokenmill_model_info",
        "tokenmill_step_duration_seconds",
        "tokenmill_step_host_seconds",
        "tokenmill_paused_partitions",
        "tokenmill_child_restarts_total",
        "tokenmill_model_swaps_total",
        "tokenmill_swap_pause_seconds",
        "tokenmill_process_resident_memory_bytes",
        "tokenmill_device_memory_allocated_bytes",
        "tokenmill_device_memory_reserved_bytes",
        "tokenmill_gpu_utilization_ratio",
        "tokenmill_gpu_memory_bandwidth_utilization_ratio",
    } <= names


def test_outcomes_count_by_finish_reason_and_error_code() -> None:
    metrics = WorkerMetrics()
    timings = Timings(queued_ms=2.0, ttft_ms=40.0, tpot_ms=8.0, total_ms=200.0)
    metrics.observe_outcome(finished(timings=timings), admitted=True)
    metrics.observe_outcome(finished(reason=FinishReason.LENGTH, timings=timings), admitted=True)
    metrics.observe_outcome(
        finished(reason=FinishReason.ERROR, prompt=0, completion=0, error=ErrorCode.EMPTY_PROMPT),
        admitted=False,
    )
    metrics.observe_outcome(
        finished(
            reason=FinishReason.DEADLINE,
            completion=1,
            timings=Timings(ttft_ms=900.0, total_ms=1500.0),
            error=ErrorCode.DEADLINE_EXCEEDED,
        ),
        admitted=True,
    )
    s = scrape(metrics)
    requests = "tokenmill_requests_total"
    assert value(s, requests, outcome="stop", code="") == 1
    assert value(s, requests, outcome="length", code="") == 1
    assert value(s, requests, outcome="error", code="empty_prompt") == 1
    assert value(s, requests, outcome="deadline", code="deadline_exceeded") == 1
    assert value(s, "tokenmill_prompt_tokens_total") == 15
    assert value(s, "tokenmill_generated_tokens_total") == 7

    # Latencies in seconds, only from the three that reached the engine.
    assert value(s, "tokenmill_ttft_seconds_count") == 3
    assert value(s, "tokenmill_ttft_seconds_sum") == pytest.approx(0.98)
    assert value(s, "tokenmill_ttft_seconds_bucket", le="0.05") == 2
    assert value(s, "tokenmill_tpot_seconds_count") == 2  # the deadline one made one token
    assert value(s, "tokenmill_tpot_seconds_sum") == pytest.approx(0.016)
    assert value(s, "tokenmill_request_duration_seconds_count") == 3
    assert value(s, "tokenmill_request_duration_seconds_sum") == pytest.approx(1.9)


def test_batches_fill_the_histograms_and_count_flushes_by_reason() -> None:
    metrics = WorkerMetrics()
    assert value(scrape(metrics), "tokenmill_bucket_flushes_total", reason="wait") == 0
    metrics.observe_batch(size=8, tokens=300, reason="tokens")
    metrics.observe_batch(size=1, tokens=20, reason="wait")
    metrics.observe_batch(size=3, tokens=90, reason="wait")
    s = scrape(metrics)
    assert value(s, "tokenmill_bucket_flushes_total", reason="wait") == 2
    assert value(s, "tokenmill_bucket_flushes_total", reason="tokens") == 1
    assert value(s, "tokenmill_bucket_flushes_total", reason="size") == 0
    assert value(s, "tokenmill_batch_size_count") == 3
    assert value(s, "tokenmill_batch_size_sum") == 12
    assert value(s, "tokenmill_batch_size_bucket", le="1.0") == 1
    assert value(s, "tokenmill_batch_size_bucket", le="4.0") == 2
    assert value(s, "tokenmill_batch_size_bucket", le="256.0") == 3
    assert value(s, "tokenmill_batch_tokens_sum") == 410
    assert value(s, "tokenmill_batch_tokens_bucket", le="128.0") == 2


def test_steps_set_the_kv_gauges_and_count_preemptions() -> None:
    metrics = WorkerMetrics()
    metrics.observe_step(step())
    metrics.observe_step(step(num_preempted=2, kv_blocks_used=120))
    metrics.observe_step(step(num_preempted=1, kv_blocks_used=60))
    s = scrape(metrics)
    assert value(s, "tokenmill_kv_blocks_used") == 60
    assert value(s, "tokenmill_kv_blocks_total") == 120
    assert value(s, "tokenmill_kv_usage_ratio") == 0.5
    assert value(s, "tokenmill_preemptions_total") == 3
    assert value(s, "tokenmill_step_duration_seconds_count") == 3
    assert value(s, "tokenmill_step_duration_seconds_sum") == pytest.approx(0.06)
    assert value(s, "tokenmill_step_duration_seconds_bucket", le="0.01") == 0
    assert value(s, "tokenmill_step_duration_seconds_bucket", le="0.025") == 3
    assert value(s, "tokenmill_step_host_seconds_count") == 0  # no step said it ran the model


def test_steps_that_ran_the_model_report_their_host_time() -> None:
    metrics = WorkerMetrics()
    metrics.observe_step(step(forward_ns=15_000_000))  # 20 ms a step, 15 in the forward
    metrics.observe_step(step(forward_ns=19_000_000))
    s = scrape(metrics)
    assert value(s, "tokenmill_step_host_seconds_count") == 2
    assert value(s, "tokenmill_step_host_seconds_sum") == pytest.approx(0.006)


def test_prefix_cache_hits_are_counted_and_their_ratio_is_over_a_window_of_steps() -> None:
    from actors.telemetry.step_metrics import HIT_RATIO_WINDOW

    metrics = WorkerMetrics()
    metrics.observe_step(step(prompt_tokens=600, cached_prompt_tokens=0, kv_blocks_cached=3))
    metrics.observe_step(step())  # admitted nothing: the ratio does not move
    metrics.observe_step(step(prompt_tokens=600, cached_prompt_tokens=512, kv_blocks_cached=5))
    s = scrape(metrics)
    assert value(s, "tokenmill_kv_prefix_hit_tokens_total") == 512
    assert value(s, "tokenmill_kv_prefix_miss_tokens_total") == 688
    assert value(s, "tokenmill_kv_prefix_hit_ratio") == pytest.approx(512 / 1200)
    assert value(s, "tokenmill_kv_blocks_cached") == 5
    for _ in range(HIT_RATIO_WINDOW):  # the early misses leave the window
        metrics.observe_step(step(prompt_tokens=100, cached_prompt_tokens=75))
    assert value(scrape(metrics), "tokenmill_kv_prefix_hit_ratio") == pytest.approx(0.75)


def test_an_empty_kv_pool_reads_as_zero_usage() -> None:
    metrics = WorkerMetrics()
    metrics.observe_step(step(kv_blocks_used=0, kv_blocks_total=0))
    assert value(scrape(metrics), "tokenmill_kv_usage_ratio") == 0


def test_gauges_take_the_last_value_and_lag_is_per_partition() -> None:
    metrics = WorkerMetrics()
    metrics.set_queue_depth(7)
    metrics.set_queue_depth(4)
    metrics.set_paused_partitions(2)
    metrics.set_consumer_lag(0, 10)
    metrics.set_consumer_lag(3, 250)
    metrics.set_consumer_lag(0, 12)
    s = scrape(metrics)
    assert value(s, "tokenmill_queue_depth") == 4
    assert value(s, "tokenmill_paused_partitions") == 2
    assert value(s, "tokenmill_consumer_lag", partition="0") == 12
    assert value(s, "tokenmill_consumer_lag", partition="3") == 250

    metrics.forget_partition(3)
    metrics.forget_partition(5)  # never reported: nothing to drop
    lags = {k: v for k, v in scrape(metrics).items() if k[0] == "tokenmill_consumer_lag"}
    assert lags == {("tokenmill_consumer_lag", (("partition", "0"),)): 12}


def test_model_info_names_the_active_and_standby_models_and_forgets_old_ones() -> None:
    metrics = WorkerMetrics()
    metrics.set_models(("smollm2-135m", "aaa", "none"), None)
    metrics.set_models(("smollm2-360m", "bbb", "int4-g32"), ("smollm2-135m", "aaa", "none"))
    info = {k[1]: v for k, v in scrape(metrics).items() if k[0] == "tokenmill_model_info"}
    active = (("digest", "bbb"), ("name", "smollm2-360m"), ("quantization", "int4-g32"))
    standby = (("digest", "aaa"), ("name", "smollm2-135m"), ("quantization", "none"))
    assert info == {(*active, ("slot", "active")): 1, (*standby, ("slot", "standby")): 1}


def test_swaps_restarts_and_device_memory() -> None:
    metrics = WorkerMetrics()
    metrics.swap("swapped", pause_s=0.3)
    metrics.swap("refused")
    metrics.child_restarted("ingest")
    metrics.child_restarted("ingest")
    metrics.child_restarted("emitter")
    s = scrape(metrics)
    assert value(s, "tokenmill_model_swaps_total", outcome="swapped") == 1
    assert value(s, "tokenmill_model_swaps_total", outcome="refused") == 1
    assert value(s, "tokenmill_model_swaps_total", outcome="failed") == 0
    assert value(s, "tokenmill_swap_pause_seconds_count") == 1
    assert value(s, "tokenmill_swap_pause_seconds_sum") == pytest.approx(0.3)
    assert value(s, "tokenmill_child_restarts_total", child="ingest") == 2
    assert value(s, "tokenmill_child_restarts_total", child="emitter") == 1
    # A CPU worker never reports device memory: no series at all, rather than a 0.
    assert not [k for k in s if k[0].startswith("tokenmill_device_memory")]

    metrics.set_device_memory("cuda:0", allocated=3 << 30, reserved=4 << 30)
    s = scrape(metrics)
    assert value(s, "tokenmill_device_memory_allocated_bytes", device="cuda:0") == 3 << 30
    assert value(s, "tokenmill_device_memory_reserved_bytes", device="cuda:0") == 4 << 30

    with pytest.raises(ValueError, match="swap outcome must be one of"):
        metrics.swap("flipped")  # type: ignore[arg-type]


def test_gpu_utilization_is_per_nvml_device_and_a_silent_gpu_loses_its_series() -> None:
    metrics = WorkerMetrics()
    assert not [k for k in scrape(metrics) if k[0].startswith("tokenmill_gpu_")]  # CPU: none

    metrics.set_gpu_utilization([GpuUtilization(0, 0.87, 0.4), GpuUtilization(1, 0.0, 1.0)])
    s = scrape(metrics)
    assert value(s, "tokenmill_gpu_utilization_ratio", device="nvml:0") == pytest.approx(0.87)
    assert value(s, "tokenmill_gpu_utilization_ratio", device="nvml:1") == 0
    bandwidth = "tokenmill_gpu_memory_bandwidth_utilization_ratio"
    assert value(s, bandwidth, device="nvml:0") == pytest.approx(0.4)
    assert value(s, bandwidth, device="nvml:1") == 1

    metrics.set_gpu_utilization([GpuUtilization(1, 0.5, 0.25)])  # nvml:0 did not answer
    gpus = {k: v for k, v in scrape(metrics).items() if k[0].startswith("tokenmill_gpu_")}
    assert gpus == {
        ("tokenmill_gpu_utilization_ratio", (("device", "nvml:1"),)): 0.5,
        (bandwidth, (("device", "nvml:1"),)): 0.25,
    }


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="the collector reads /proc")
def test_the_process_collector_reports_resident_memory() -> None:
    s = scrape(WorkerMetrics())
    assert value(s, "tokenmill_process_resident_memory_bytes") > 0


def test_two_workers_do_not_share_series() -> None:
    one, two = WorkerMetrics(), WorkerMetrics()
    one.observe_outcome(finished(), admitted=True)
    one.set_queue_depth(9)
    one.child_restarted("gpu")
    s = scrape(two)
    assert ("tokenmill_requests_total", (("code", ""), ("outcome", "stop"))) not in s
    assert value(s, "tokenmill_generated_tokens_total") == 0
    assert value(s, "tokenmill_queue_depth") == 0
    assert not [k for k in s if k[0] == "tokenmill_child_restarts_total"]
    assert value(scrape(one), "tokenmill_generated_tokens_total") == 3


def test_trace_spans_follow_the_sinks_running_totals() -> None:
    metrics = WorkerMetrics()
    assert value(scrape(metrics), "tokenmill_trace_spans_total", outcome="dropped") == 0
    metrics.set_trace_spans(5, 0)
    metrics.set_trace_spans(8, 2)
    metrics.set_trace_spans(8, 2)  # a scrape with nothing new adds nothing
    samples = scrape(metrics)
    assert value(samples, "tokenmill_trace_spans_total", outcome="handed_on") == 8
    assert value(samples, "tokenmill_trace_spans_total", outcome="dropped") == 2


def test_send_failures_are_counted_by_what_followed() -> None:
    metrics = WorkerMetrics()
    for action in ("retried", "retried", "answered"):
        metrics.send_failed(action)
    text = metrics.render().decode()
    assert 'tokenmill_send_failures_total{action="retried"} 2.0' in text
    assert 'tokenmill_send_failures_total{action="answered"} 1.0' in text


def test_the_guards_export_the_step_age_its_bound_stalls_and_the_rss_growth() -> None:
    metrics = WorkerMetrics()
    s = scrape(metrics)
    assert value(s, "tokenmill_engine_stalls_total") == 0
    assert value(s, "tokenmill_max_rss_bytes") == 0, "no limit"
    metrics.observe_engine_progress(2.5, 30.0)
    metrics.engine_stalled()
    metrics.observe_rss(1.5e6, 8 << 30)
    s = scrape(metrics)
    assert value(s, "tokenmill_engine_step_running_seconds") == 2.5
    assert value(s, "tokenmill_engine_stall_bound_seconds") == 30.0
    assert value(s, "tokenmill_engine_stalls_total") == 1
    assert value(s, "tokenmill_rss_growth_bytes_per_second") == 1.5e6
    assert value(s, "tokenmill_max_rss_bytes") == 8 << 30
