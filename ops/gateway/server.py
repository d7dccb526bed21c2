"""Building and running one gateway instance on uvicorn.

    server = gateway_server(settings, kafka, keys)   # a uvicorn.Server, not started
    await server.serve()                             # until SIGINT/SIGTERM: a clean stop

A clean stop finishes the requests in flight (uvicorn's graceful shutdown), stops the batches
running here (each resumes at the next start on the same `--batch-dir`), then the app's
lifespan deletes the instance's reply topics.
"""

from __future__ import annotations

import uuid

import uvicorn

from actors.kafka.connection import KafkaConnection
from ops.gateway.app import build_app
from ops.gateway.batch_runner import BatchRunner
from ops.gateway.batches import BatchStore
from ops.gateway.files import FileStore
from ops.gateway.fleet import FleetWatch
from ops.gateway.keys import KeyCheck, check_exposure
from ops.gateway.replies import Replies
from ops.gateway.service import Gateway
from ops.gateway.settings import GatewaySettings


def gateway_server(
    settings: GatewaySettings, kafka: KafkaConnection, keys: KeyCheck
) -> uvicorn.Server:
    """The server for `settings`; `GatewayStartError` when it must not listen as asked."""
    check_exposure(settings.host, keys)
    instance = settings.instance_id or uuid.uuid4().hex[:12]
    replies = Replies(
        kafka,
        requests_topic=settings.requests_topic,
        cancel_topic=settings.cancel_topic,
        reply_topic=settings.reply_topic(instance),
        reply_partitions=settings.reply_partitions,
        batch_reply_topic=settings.batch_reply_topic(instance),
    )
    root = settings.batch_root()
    files = FileStore(root / "files")
    batches = BatchRunner(
        BatchStore(root / "batches"),
        files,
        kafka,
        settings,
        results_topic=settings.batch_reply_topic(instance),
    )
    fleet = (
        FleetWatch(kafka, settings.events_topic, settings.group, settings.models_refresh)
        if settings.events_topic
        else None
    )
    app = build_app(Gateway(settings, replies, instance), keys, fleet, batches)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        lifespan="on",
        access_log=False,  # one line per request is log volume; /metrics counts them
        log_level="info",
        timeout_graceful_shutdown=30,
    )
    return uvicorn.Server(config)
