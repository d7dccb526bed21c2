"""The engine's per-step series of one worker's registry: step time and its host part, the KV
pool's occupancy, preemptions, and prefix-cache hits (with their ratio over recent steps)."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    from gpu.engine_io import StepStats  # gpu imports torch; only its fields are read here

STEP_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
HIT_RATIO_WINDOW = 256  # engine steps that admitted requests, for tokenmill_kv_prefix_hit_ratio


class StepMetrics:
    """What each engine step reports (`StepStats`), as Prometheus series."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.kv_usage_ratio = Gauge(
            "tokenmill_kv_usage_ratio", "Share of the KV pool's blocks in use (0-1).", registry=r
        )
        self.kv_blocks_used = Gauge("tokenmill_kv_blocks_used", "KV blocks in use.", registry=r)
        self.kv_blocks_total = Gauge(
            "tokenmill_kv_blocks_total", "KV blocks in the pool.", registry=r
        )
        self.kv_blocks_cached = Gauge(
            "tokenmill_kv_blocks_cached",
            "KV blocks nothing holds that keep a cached prefix (reused or evicted on demand).",
            registry=r,
        )
        self.kv_prefix_hit_tokens = Counter(
            "tokenmill_kv_prefix_hit_tokens",
            "Prompt tokens whose K/V the prefix cache served.",
            registry=r,
        )
        self.kv_prefix_miss_tokens = Counter(
            "tokenmill_kv_prefix_miss_tokens",
            "Prompt tokens computed (not found in the prefix cache).",
            registry=r,
        )
        self.kv_prefix_hit_ratio = Gauge(
            "tokenmill_kv_prefix_hit_ratio",
            f"Prompt tokens served from the prefix cache / prompt tokens, over the last "
            f"{HIT_RATIO_WINDOW} engine steps that admitted requests (0-1).",
            registry=r,
        )
        self._hit_window: deque[tuple[int, int]] = deque(maxlen=HIT_RATIO_WINDOW)
        self.preemptions = Counter(
            "tokenmill_preemptions",
            "Sequences preempted when KV blocks ran out.",
            registry=r,
        )
        self.step_duration = Histogram(
            "tokenmill_step_duration_seconds",
            "Engine steps: schedule, forward and sample.",
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.step_host = Histogram(
            "tokenmill_step_host_seconds",
            "Engine steps' time outside the model's forward call (scheduling, inputs, "
            "sampling, collecting): on a CPU, the host overhead the forward waits for.",
            buckets=STEP_BUCKETS,
            registry=r,
        )

    def observe_step(self, stats: StepStats) -> None:
        """One engine step: its duration and host part, the KV pool's occupancy,
        preemptions, prefix hits."""
        self.step_duration.observe(max(0, stats.end_ns - stats.start_ns) / 1e9)
        if stats.forward_ns:  # a step that ran the model
            self.step_host.observe(stats.host_ns / 1e9)
        self.kv_blocks_used.set(stats.kv_blocks_used)
        self.kv_blocks_total.set(stats.kv_blocks_total)
        total = stats.kv_blocks_total
        self.kv_usage_ratio.set(stats.kv_blocks_used / total if total > 0 else 0.0)
        if stats.num_preempted > 0:
            self.preemptions.inc(stats.num_preempted)
        self.kv_blocks_cached.set(stats.kv_blocks_cached)
        if stats.prompt_tokens > 0:
            self.kv_prefix_hit_tokens.inc(stats.cached_prompt_tokens)
            self.kv_prefix_miss_tokens.inc(stats.prompt_tokens - stats.cached_prompt_tokens)
            self._hit_window.append((stats.prompt_tokens, stats.cached_prompt_tokens))
            prompt = sum(p for p, _ in self._hit_window)
            self.kv_prefix_hit_ratio.set(sum(c for _, c in self._hit_window) / prompt)
