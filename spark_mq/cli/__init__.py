"""The ``sparkmq`` command. Each module adds a family of subcommands:

* :mod:`.serving`: ``broker`` (run one) and ``demo``;
* :mod:`.data`: ``compact``, ``schedule``, ``export``, ``import`` (the tables, offline);
* :mod:`.users`: ``user ...`` (the users file of security);
* :mod:`.live` and :mod:`.messages`: commands against a running broker (``queue``, ``topic``,
  ``subscription``, ``produce``, ``consume``, ``move``, ``redrive``, ``claims``, ``status``).
"""

from __future__ import annotations

import click

from spark_mq.cli import data, live, messages, serving, users


@click.group()
@click.version_option(package_name="sparkmq")
def main() -> None:
    """sparkmq: JMS-grade messaging on Delta tables, streamed by Spark."""


for _module in (serving, data, users, live, messages):
    for _command in _module.COMMANDS:
        main.add_command(_command)
