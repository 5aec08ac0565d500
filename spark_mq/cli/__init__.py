"""The ``sparkmq`` command. Each module adds a family of subcommands:

* :mod:`.serving`: ``broker`` (run one) and ``demo``;
* :mod:`.data`: ``compact``, ``schedule``, ``export``, ``import`` (the tables, offline);
* :mod:`.users`: ``user ...`` (the users file of security);
* against a running broker (:mod:`.target`: where it is, who asks): :mod:`.destinations`
  (``status``, ``queue``, ``topic``, ``subscription``), :mod:`.moving` (``move``, ``redrive``,
  ``claims``) and :mod:`.messages` (``produce``, ``consume``);
* :mod:`.kafka`: ``kafka groups`` (over the Kafka protocol, as Kafka's own tools do);
* :mod:`.cluster`: ``cluster status``, ``cluster pin`` (a cluster of brokers, through a member).
"""

from __future__ import annotations

import click

from spark_mq import native
from spark_mq.cli import cluster, data, destinations, kafka, messages, moving, serving, users


@click.group()
@click.version_option(package_name="sparkmq", message=f"%(prog)s %(version)s ({native.describe()})")
def main() -> None:
    """sparkmq: JMS-grade messaging on Delta tables, streamed by Spark."""


for _module in (serving, data, users, destinations, moving, messages, kafka, cluster):
    for _command in _module.COMMANDS:
        main.add_command(_command)
