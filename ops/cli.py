"""`tokenmill`: the operator's command line.

Each command lives in its own `ops/cmd_*.py` module; this file only assembles the group.
"""

from __future__ import annotations

import click

from ops.cmd_batch import batch
from ops.cmd_bench import bench
from ops.cmd_control import drain, rollback, status, swap
from ops.cmd_generate import generate
from ops.cmd_models import models
from ops.cmd_plan import plan
from ops.cmd_services import down, up
from ops.cmd_submit import submit
from ops.cmd_topics import topics
from ops.cmd_trace import trace
from ops.cmd_worker import worker


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tokenmill")
def cli() -> None:
    """tokenmill: LLM generation jobs from Kafka topics, on an engine of its own."""


cli.add_command(generate)
cli.add_command(models)
cli.add_command(plan)
cli.add_command(bench)
cli.add_command(up)
cli.add_command(down)
cli.add_command(topics)
cli.add_command(worker)
cli.add_command(submit)
cli.add_command(batch)
cli.add_command(trace)
cli.add_command(swap)
cli.add_command(rollback)
cli.add_command(drain)
cli.add_command(status)


def main() -> None:
    cli()
