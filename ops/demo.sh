#!/usr/bin/env bash
# `make demo`: the main job end to end on this machine, through a real Kafka broker.
#   fetch SmolLM2-135M → start Kafka (from its Maven jars) → create topics → start a worker →
#   `tokenmill batch run` on ops/samples/batch.jsonl (OpenAI Batch JSONL) → print the results
#   table and the run's throughput → print one request's trace from Jaeger → drain the worker →
#   stop Kafka and Jaeger. Jaeger is started when Go is there to build it (or it is built).
# The broker is a fresh one (its own state dir, a free port unless TOKENMILL_DEMO_KAFKA_PORT),
# so no earlier backlog stands before the demo's lines. KEEP_RUNNING=1 leaves Kafka and the
# worker up and says how to stop them.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-uv run --locked}
WORK=${TMPDIR:-/tmp}/tokenmill-demo
STATE=$WORK/kafka
INPUT=ops/samples/batch.jsonl
OUTPUT=$WORK/batch-output.jsonl
LOG=$WORK/worker.log
JAEGER_STATE=$WORK/jaeger
mkdir -p "$WORK"
rm -f "$OUTPUT" # a fresh run (an existing output file would be resumed, i.e. skipped)

$RUN tokenmill models fetch smollm2-135m >/dev/null
$RUN tokenmill down --state-dir "$STATE" >/dev/null 2>&1 || true # one left by KEEP_RUNNING=1
rm -rf "$STATE"
JAEGER=()
if command -v go >/dev/null || $RUN python -c 'import sys; from ops.services.jaeger_build import is_built; sys.exit(not is_built())'; then
    JAEGER=(--jaeger --jaeger-ui-port "${TOKENMILL_DEMO_JAEGER_PORT:-0}" --otlp-grpc-port 0
        --otlp-http-port 0 --jaeger-state-dir "$JAEGER_STATE")
else
    echo "jaeger: skipped (no Go to build it); traces need \`tokenmill up --jaeger\`" >&2
fi
BOOTSTRAP=$($RUN tokenmill up --kafka-port "${TOKENMILL_DEMO_KAFKA_PORT:-0}" --state-dir "$STATE" \
    "${JAEGER[@]}" 2>"$WORK/up.log") || { cat "$WORK/up.log" >&2; exit 1; }
cat "$WORK/up.log" >&2
export TOKENMILL_BOOTSTRAP_SERVERS=$BOOTSTRAP
JAEGER_URL=$(sed -n 's/.*UI and query API at \([^ ]*\).*/\1/p' "$WORK/up.log")
OTLP=$(sed -n 's/.*export OTEL_EXPORTER_OTLP_ENDPOINT=//p' "$WORK/up.log")
if [[ -n "$OTLP" ]]; then
    export OTEL_EXPORTER_OTLP_ENDPOINT=$OTLP OTEL_BSP_SCHEDULE_DELAY=200
fi
WORKER=""
finish() {
    if [[ "${KEEP_RUNNING:-0}" == 1 ]]; then
        echo "left running: worker pid ${WORKER:-none} (log $LOG), Kafka at $BOOTSTRAP;" \
            "stop them with: kill -TERM ${WORKER:-<pid>};" \
            "$RUN tokenmill down --state-dir $STATE --jaeger-state-dir $JAEGER_STATE" >&2
        return
    fi
    if [[ -n "$WORKER" ]] && kill -0 "$WORKER" 2>/dev/null; then
        kill -TERM "$WORKER"
        wait "$WORKER" && echo "worker: drained and stopped (exit 0)" >&2
    fi
    $RUN tokenmill down --state-dir "$STATE" --jaeger-state-dir "$JAEGER_STATE"
}
trap finish EXIT
$RUN tokenmill topics create

# The control plane's shared secret (for `tokenmill status` below) and a free HTTP port.
export TOKENMILL_CONTROL_SECRET=${TOKENMILL_CONTROL_SECRET:-demo-$RANDOM$RANDOM}
HTTP_PORT=$($RUN python -c 'from ops.services.local_process import free_port; print(free_port())')
$RUN tokenmill worker --model smollm2-135m --group tokenmill-demo --http-port "$HTTP_PORT" \
    >"$LOG" 2>&1 &
WORKER=$!
echo "worker: pid $WORKER, log $LOG; waiting until it consumes" >&2
for _ in $(seq 600); do
    grep -q '"ingest_started"' "$LOG" && break
    kill -0 "$WORKER" 2>/dev/null || { tail -20 "$LOG" >&2; exit 1; }
    sleep 0.5
done

$RUN tokenmill batch run "$INPUT" -o "$OUTPUT" --stall-timeout 300
$RUN tokenmill batch show "$OUTPUT"
echo "input $INPUT → output $OUTPUT ($(wc -l <"$OUTPUT") lines, OpenAI Batch output format)"
$RUN tokenmill status # a signed Status command; the worker answers on tokenmill.events
echo "worker: http://127.0.0.1:$HTTP_PORT/readyz and /metrics (Prometheus)" >&2

if [[ -n "$JAEGER_URL" ]]; then
    REQUEST=$(grep -m1 '"status_code":200' "$OUTPUT" | sed 's/.*"request_id":"\([^"]*\)".*/\1/')
    echo "one request's trace (tokenmill trace $REQUEST --jaeger $JAEGER_URL):" >&2
    for _ in $(seq 20); do # the worker exports its spans within a fraction of a second
        $RUN tokenmill trace "$REQUEST" --jaeger "$JAEGER_URL" 2>/dev/null && break
        sleep 0.5
    done
    echo "jaeger: query API at $JAEGER_URL/api/traces?service=tokenmill" >&2
fi
