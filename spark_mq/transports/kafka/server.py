"""The Kafka service: Kafka clients of any language (librdkafka and everything over it, the
Java client, kafka-python, aiokafka, kafkajs, kcat) on a port of their own
(``broker.kafka_port``, 9092 by default), served by one asyncio event loop on a thread of its
own (``kafka-loop``, a :class:`~spark_mq.connection.loop_listener.LoopListener`), as STOMP is.

Each connection (:class:`~spark_mq.transports.kafka.connection.KafkaConnection`) is one more
protocol adapter over the session layer: its SASL exchange logs in (off the loop), it gets a
``ClientSession``, and its requests become the session's calls
(:mod:`~spark_mq.transports.kafka.requests`). Nothing here decides delivery.

Every sparkmq destination is a Kafka topic of one partition, led by this broker (node 0, at
``broker.kafka_advertised_host``/``_port``, or the address it listens on), or on a cluster by
the member that owns it (:mod:`~spark_mq.transports.kafka.nodes`). The listener keeps what its
connections share: the consumer-group coordinator, the share groups, idempotent producers'
next sequences and transactional producers' open transactions (all the loop's: no locks).
"""

from __future__ import annotations

import asyncio

from spark_mq.connection.gateway import Gateway
from spark_mq.connection.loop_listener import LoopListener
from spark_mq.transports.kafka.connection import KafkaConnection
from spark_mq.transports.kafka.groups import Coordinator
from spark_mq.transports.kafka.nodes import Nodes, Placement
from spark_mq.transports.kafka.sequences import Sequences
from spark_mq.transports.kafka.share import ShareGroups
from spark_mq.transports.kafka.transaction_admin import state_of
from spark_mq.transports.kafka.transactions import EMPTY, ProducerTransactions


class KafkaServer(LoopListener):
    conns: set[KafkaConnection]

    def __init__(
        self, gateway: Gateway, host: str, port: int, placement: Placement | None = None
    ) -> None:
        super().__init__(gateway, "kafka", label="Kafka")
        # where things are: this broker, or (``placement``: a cluster member's) its members
        self.nodes = Nodes(lambda: self.advertised, gateway.config.ha.broker_id, placement)
        self.groups = Coordinator(
            self.loop, initial_delay_s=self.settings.kafka_group_initial_delay_ms / 1000
        )
        self.share_groups = ShareGroups()
        self.sequences = Sequences()  # idempotent producers' next sequences
        # transactional producers and their open transactions
        self.transactions = ProducerTransactions(gateway.config.limits.max_batch_bytes)
        self._host = host
        self.listen(host, port, lambda: KafkaConnection(self))

    @property
    def advertised(self) -> tuple[str, int]:
        """Where Metadata tells clients this broker is."""
        s = self.settings
        return s.kafka_advertised_host or self._host, s.kafka_advertised_port or self.port

    def swept(self, now: float) -> None:
        for group in self.groups.sweep():  # (members silent past their session timeout)
            keep = self.groups.keepers.pop(group, None)
            if keep is not None:  # (a cluster's: kept empty, or its ghosts come back)
                keep(group)
        self.share_groups.sweep()
        self.transactions.sweep()

    def transactions_now(self, timeout: float = 5.0) -> dict[str, int]:
        """(Any thread.) The transactional producers, their open transactions and those
        aborted for their timeout, as the loop has them."""

        async def snapshot() -> dict[str, int]:
            return self.transactions.figures()

        if self.loop.is_closed():
            return {}
        return asyncio.run_coroutine_threadsafe(snapshot(), self.loop).result(timeout)

    def transactions_listed(self, timeout: float = 5.0) -> list[dict[str, object]]:
        """(Any thread.) Each transactional id as the loop has it, for the console: its
        principal, state, producer id and epoch, how long its transaction has been open, its
        partitions and the bytes it keeps."""

        async def snapshot() -> list[dict[str, object]]:
            now = self.transactions.clock()
            return [
                {
                    "owner": t.owner,
                    "transactional_id": t.tid,
                    "state": state_of(t),
                    "producer_id": str(t.producer_id),  # (JavaScript's numbers hold 53 bits)
                    "producer_epoch": t.epoch,
                    "open_for_s": round(now - t.began, 3) if t.state != EMPTY else None,
                    "timeout_s": t.timeout_s,
                    "partitions": [f"{topic}[{i}]" for topic, i in sorted(t.partitions)],
                    "kept_bytes": t.nbytes,
                }
                for t in self.transactions.listed(None)
            ]

        if self.loop.is_closed():
            return []
        return asyncio.run_coroutine_threadsafe(snapshot(), self.loop).result(timeout)

    def groups_now(self, timeout: float = 5.0) -> list[dict[str, object]]:
        """(Any thread.) The consumer and share groups as the loop has them: kind, group,
        state, generation, members."""

        async def snapshot() -> list[dict[str, object]]:
            out: list[dict[str, object]] = [
                {"kind": "consumer", **g.describe()} for g in self.groups.listed()
            ]
            for g in self.share_groups.groups.values():
                out.append(
                    {
                        "kind": "share",
                        "group": g.id,
                        "state": "Stable" if g.members else "Empty",
                        "generation": g.epoch,
                        "members": [{"member_id": m.id} for m in g.members.values()],
                    }
                )
            return out

        if self.loop.is_closed():
            return []
        return asyncio.run_coroutine_threadsafe(snapshot(), self.loop).result(timeout)
