"""`tokenmill`: the operator's command line.

Each command family lives in a sub-package of its own (`ops/<family>/cli.py`); this file only
assembles the group.
"""

from __future__ import annotations

import click

from ops.batch.cli import batch
from ops.bench.cli import bench
from ops.cancel.cli import cancel
from ops.control.cli import drain, rollback, status, swap
from ops.models.cli import models
from ops.models.generate_cli import generate
from ops.models.plan_cli import plan
from ops.quant.cli import quantize
from ops.services.cli import down, up
from ops.services.topics_cli import topics
from ops.submit.cli import submit
from ops.trace.cli import trace
from ops.worker.cli import worker


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tokenmill")
def cli() -> None:
    """tokenmill: LLM generation jobs from Kafka topics, on an engine of its own."""


cli.add_command(generate)
cli.add_command(models)
cli.add_command(plan)
cli.add_command(quantize)
cli.add_command(bench)
cli.add_command(up)
cli.add_command(down)
cli.add_command(topics)
cli.add_command(worker)
cli.add_command(submit)
cli.add_command(cancel)
cli.add_command(batch)
cli.add_command(trace)
cli.add_command(swap)
cli.add_command(rollback)
cli.add_command(drain)
cli.add_command(status)


def main() -> None:
    cli()
