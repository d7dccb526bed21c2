"""The few lines `tokenmill bench ...` prints for a person (without --json): a report's
headline figures; the JSON holds everything."""

from __future__ import annotations

from typing import Any


def pipeline_summary(report: dict[str, Any]) -> str:
    """A few lines for a person; the JSON holds everything."""
    env, lines = report["environment"], []
    lines.append(
        f"{(report['model'] or {}).get('name')} · {env['cpus_usable']} CPUs · "
        f"{env['torch_threads']} torch threads · worker: {report['worker']['mode']}"
    )
    t, lat, c = report["throughput"], report["latency"], report["ceiling"]
    if "ratio" in t:
        lines.append(
            f"  throughput  ratio {t['ratio']}, the median of rounds "
            f"{', '.join(str(x) for x in t['ratios'])} · over all rounds: direct "
            f"{t['direct']['output_tokens_per_s']} tok/s, kafka "
            f"{t['kafka']['output_tokens_per_s']} tok/s"
        )
    if "added_ms" in lat:
        e2e, d = lat["kafka"]["end_to_end_ms"], lat["direct_ms"]
        lines.append(
            f"  latency     p50 {e2e['p50']} ms vs direct {d['p50']} ms · p99 {e2e['p99']} vs "
            f"{d['p99']} · added p50 {lat['added_ms']['p50']} ms, p99 {lat['added_ms']['p99']}"
        )
    if "prompt_token_ids" in c:
        floor = c["latency_at_light_rate"]["end_to_end_ms"]
        lines.append(f"  echo        p50 {floor['p50']} ms, p99 {floor['p99']} ms end to end")
        lines.append(
            f"  ceiling     {c['prompt_token_ids']['requests_per_s']} req/s (token ids) · "
            f"{c['text_prompts']['requests_per_s']} req/s (text)"
        )
    tracing = report["tracing"]
    for label, tr in (("echo", tracing), ("model", tracing.get("model", {}))):
        if "ratio_on_vs_off" not in tr:
            continue
        rates, elsewhere = tr["requests_per_s"], tr["tracing_cpu_us_per_request_elsewhere"]
        lines.append(
            f"  tracing ({label}) off {rates['off']} req/s · on {rates['on']} req/s · ratio "
            f"{tr['ratio_on_vs_off']} (target ≥ {tr['target_ratio_at_least']})"
        )
        lines.append(
            f"    CPU per request: worker +{tr['tracing_cpu_us_per_request']} µs · "
            f"span export {elsewhere['span_export']} µs · jaeger {elsewhere['jaeger']} µs"
        )
    for key, target in report["targets"].items():
        verdict = {True: "met", False: "NOT met", None: "not measured"}[target["met"]]
        lines.append(f"  {key:<30} {target['value']}  (target {target['target']}: {verdict})")
    lines += [f"  warning: {w}" for w in report["warnings"]]
    return "\n".join(lines)


def summary(report: dict[str, Any]) -> str:
    """A few lines for a person; the JSON holds everything."""
    w, c = report["workload"], report["contenders"]
    lines = [
        f"{report['model']['name']} · {report['environment']['device']} "
        f"{report['environment']['dtype']} ({report['environment']['linear_kernel']} linears, "
        f"{report['environment']['attention_kernel']} decode attention) · "
        f"{report['environment']['threads']} threads · "
        f"{w['requests']} requests, {w['prompt_tokens']} prompt + {w['output_tokens']} output "
        f"tokens (seed {w['seed']})",
    ]
    for name, stats in c.items():
        if "skipped" in stats:
            lines.append(f"  {name:<24} skipped: {stats['skipped']}")
            continue
        same, n = stats.get("outputs_matching_engine"), stats["requests"]
        agree = "" if same is None else f", {same} of {n} outputs equal the engine's"
        lines.append(
            f"  {name:<24} {stats['output_tokens_per_s']:>9.1f} tok/s  "
            f"({stats['requests']} requests, {stats['output_tokens']} tokens, "
            f"{stats['wall_s']:.1f} s{agree})"
        )
    for key, t in report["targets"].items():
        value = "n/a" if t["value"] is None else f"{t['value']}"
        verdict = {True: "met", False: "NOT met", None: "not measured"}[t["met"]]
        lines.append(f"  {key:<36} {value:>8}  (target {t['target']}: {verdict})")
    lat, kv, f = report["latency_ms"], report["kv"], report["flops"]
    lines.append(
        "  TTFT ms p50/p90/p99 {p50}/{p90}/{p99}".format(**lat["ttft"])
        + " · TPOT ms p50/p90/p99 {p50}/{p90}/{p99}".format(**lat["tpot"])
    )
    lines.append(
        f"  KV blocks: peak {kv['peak_blocks_used']} of {kv['blocks_allocated']} "
        f"(block {kv['block_size']}) · GEMM peak {f['gemm_peak_gflops']} GFLOP/s · engine "
        f"{f['engine_gflops']} GFLOP/s · steady decode {f['steady_decode_gflops']} GFLOP/s"
    )
    one = report["batch1"]
    lines.append(
        f"  batch 1 ({one['prompt_tokens']}-token prompt, {one['new_tokens']} new): "
        f"{one['decode_tokens_per_s']} tok/s decode, {one['decode_step_ms']} ms a step"
    )
    single = "batch-1 decode step" + (" (one native call)" if one.get("one_native_call") else "")
    for label, breakdown in (
        (single, one["breakdown"]),
        ("workload step", c["engine"].get("step_time")),
    ):
        if breakdown and breakdown.get("steps"):
            lines.append(f"  {label}: {step_parts(breakdown)}")
    if "decode_roofline" in report:
        lines += roofline_summary(report["decode_roofline"])
    cpus = report["environment"]["cpu_count"] or 1
    busy = [
        name
        for name, stats in c.items()
        if any(x is not None and x > cpus for x in stats.get("host_load_1m", []))
    ]
    if busy:
        lines.append(
            f"  warning: the host's load average passed its {cpus} CPUs during "
            f"{', '.join(busy)}: other work competed for the CPUs, figures are noisy"
        )
    return "\n".join(lines)


def swap_summary(report: dict[str, Any]) -> str:
    """A few lines for a person; the JSON holds everything."""
    c, s = report["config"], report["swap"]
    lines = [
        f"{c['model']} a → b · {c['mode']} · {c['rate_per_s']}/s for {c['duration_s']} s, "
        f"{c['max_new_tokens']} new tokens · {report['environment']['cpus_usable']} CPUs"
    ]
    if s["outcome"] == "swapped":
        lines.append(
            f"  swap   load {s['load_ms']} ms · smoke {s['smoke_ms']} ms · flip {s['flip_ms']} ms"
            f" · pause {s['pause_ms']} ms (drained: {s['drained']}) · command → swapped "
            f"{s['command_to_swapped_ms']} ms"
        )
    else:
        lines.append(f"  swap   {s['outcome']}: {s['reason']}")
    for name, w in report["windows"].items():
        lat = w["latency_ms"]
        models = ", ".join(f"{m} {n}" for m, n in w["models"].items()) or "none"
        lines.append(
            f"  {name:<6} {w['count']:>4} sent · p50 {lat['p50']} / p99 {lat['p99']} / max "
            f"{lat['max']} ms · {w['throughput_per_s']} results/s · answered by {models}"
        )
    lines.append(
        f"  lost {report['lost']} · duplicates {report['duplicates']} · errors "
        f"{report['errors'] or 0} · p99 during/before {report['p99_during_over_before']} · "
        f"throughput dip {report['throughput_dip']}"
    )
    lines += [f"  warning: {w}" for w in report["warnings"]]
    return "\n".join(lines)


def step_parts(breakdown: dict[str, Any]) -> str:
    """'79.1 ms = dense 52.0 · attention 14.1 · …' from a `StepClock` breakdown."""
    parts = " · ".join(f"{k} {v:.1f}" for k, v in breakdown["ms_per_step"].items())
    return f"{breakdown['step_ms']:.1f} ms = {parts}"


def shared_prefix_summary(report: dict[str, Any]) -> str:
    """A few lines for a person; the JSON holds everything."""
    w, r, t = report["workload"], report["ratios"], report["targets"]
    lines = [
        f"{report['model']['name']} · {w['requests']} requests sharing a "
        f"{w['shared_prefix_tokens']}-token prefix · {w['output_tokens_each']} new tokens each"
    ]
    for name in ("caching_on", "caching_off"):
        run = report[name]
        ttft = run["ttft_ms"]
        lines.append(
            f"  {name.replace('_', ' '):<11} TTFT p50 {ttft['p50']} / p99 {ttft['p99']} ms · "
            f"{run['output_tokens_per_s']} tok/s · {run['prefill_tokens_computed']} prefill "
            f"tokens · hit ratio {run['prefix_hit_ratio']}"
        )
    lines.append(
        f"  TTFT p50 {r['ttft_p50_off_over_on']}× lower (target {t['ttft_p50']['target']}×) · "
        f"throughput {r['throughput_on_over_off']}× (target {t['throughput']['target']}×) · "
        f"outputs identical: {report['outputs_identical']}"
    )
    return "\n".join(lines)


def roofline_summary(section: dict[str, Any]) -> list[str]:
    """`bench engine`'s decode roofline section (`ops/bench/gpu_decode.py`) in a few lines."""
    one, bw = section["batch1"], section["bandwidth"]
    lines = [
        f"  decode roofline ({section['device']} {section['dtype']}, {section['timer']}): copy "
        f"{bw['bytes_per_s'] / 1e9:.1f} GB/s · batch 1 {one['tokens_per_s']:.1f} tok/s, "
        f"{one['step_ms']:.3f} ms a step against {one['roofline_step_ms']:.3f} ms at the bound "
        f"({one['bytes_per_step'] / 1e6:.1f} MB a step): {one['roofline_fraction']:.1%} of it"
    ]
    for size, run in section["batches"].items():
        if "skipped" in run:
            lines.append(f"  decode batch {size}: skipped: {run['skipped']}")
        else:
            lines.append(
                f"  decode batch {size}: {run['tokens_per_s']:.1f} tok/s, "
                f"{run['step_ms']:.3f} ms a step ({run['steady_steps']} steady steps)"
            )
    return lines
