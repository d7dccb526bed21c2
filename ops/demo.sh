#!/usr/bin/env bash
# `make demo`: the main job end to end on this machine, through a real Kafka broker.
#   start Kafka (from its Maven jars) → create topics → start a worker on SmolLM2-135M →
#   submit the sample jobs → print the results → drain the worker → stop Kafka.
# KEEP_RUNNING=1 leaves Kafka up (stop it with `tokenmill down`).
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-uv run --locked}
PORT=${TOKENMILL_DEMO_KAFKA_PORT:-9092}
LOG=${TMPDIR:-/tmp}/tokenmill-demo-worker.log

$RUN tokenmill models fetch smollm2-135m >/dev/null
BOOTSTRAP=$($RUN tokenmill up --kafka-port "$PORT")
export TOKENMILL_BOOTSTRAP_SERVERS=$BOOTSTRAP
stop_kafka() { [[ "${KEEP_RUNNING:-0}" == 1 ]] || $RUN tokenmill down; }
trap stop_kafka EXIT
$RUN tokenmill topics create

$RUN tokenmill worker --model smollm2-135m --group tokenmill-demo >"$LOG" 2>&1 &
WORKER=$!
echo "worker: pid $WORKER, log $LOG" >&2

$RUN tokenmill submit --file ops/samples/jobs.jsonl --wait --timeout 300 \
    | $RUN python -m ops.show_results || true

kill -TERM "$WORKER"
wait "$WORKER" && echo "worker: drained and stopped (exit 0)" >&2
