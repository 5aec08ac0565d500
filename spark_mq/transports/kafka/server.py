"""The Kafka service: Kafka clients of any language (librdkafka and everything over it, the
Java client, kafka-python, aiokafka, kafkajs, kcat) on a port of their own
(``broker.kafka_port``, 9092 by default), served by one asyncio event loop on a thread of its
own (``kafka-loop``), as STOMP is.

Each connection (:class:`~spark_mq.transports.kafka.connection.KafkaConnection`) is one more
protocol adapter over the session layer: its SASL exchange logs in (off the loop), it gets a
``ClientSession``, and its requests become the session's calls
(:mod:`~spark_mq.transports.kafka.requests`). Nothing here decides delivery.

Every sparkmq destination is a Kafka topic of one partition, led by this broker (node 0, at
``broker.kafka_advertised_host``/``_port``, or the address it listens on).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time

from spark_mq.connection.gateway import Gateway
from spark_mq.connection.listener import ListenerCore
from spark_mq.errors import ConfigError
from spark_mq.transports.kafka.connection import KafkaConnection
from spark_mq.transports.kafka.groups import Coordinator
from spark_mq.transports.kafka.share import ShareGroups

log = logging.getLogger(__name__)

_SWEEP_S = 0.25  # deadlines and waiting fetches are checked this often


class KafkaServer:
    name = "kafka"

    def __init__(self, gateway: Gateway, host: str, port: int) -> None:
        self.gateway = gateway
        self.core = ListenerCore(gateway, "kafka", label="Kafka")
        self.turn = self.core.turn
        self.settings = gateway.config.broker
        self.conns: set[KafkaConnection] = set()
        self._later_at: asyncio.TimerHandle | None = None
        self.draining = False
        self.loop = asyncio.new_event_loop()
        self.loop_thread = 0
        self._thread = threading.Thread(target=self._run, name="kafka-loop", daemon=True)
        self._thread.start()
        try:
            self._server = asyncio.run_coroutine_threadsafe(
                self.loop.create_server(
                    lambda: KafkaConnection(self), host, port, backlog=128, reuse_address=True
                ),
                self.loop,
            ).result()
        except OSError as exc:
            self._stop_loop()
            raise ConfigError(
                f"Kafka cannot listen on {host}:{port}: {exc.strerror or exc}; set "
                "broker.kafka_port (0 picks a free port), or broker.kafka = false",
                setting="broker.kafka_port",
            ) from exc
        self.port: int = self._server.sockets[0].getsockname()[1]
        self.advertised = (
            self.settings.kafka_advertised_host or host,
            self.settings.kafka_advertised_port or self.port,
        )
        self.groups = Coordinator(
            self.loop, initial_delay_s=self.settings.kafka_group_initial_delay_ms / 1000
        )
        self.share_groups = ShareGroups()
        # idempotent producers' next sequence, by (producer id, epoch, topic): the loop's
        self.sequences: dict[tuple[int, int, str], int] = {}
        self.loop.call_soon_threadsafe(self._sweep)

    def _run(self) -> None:
        self.loop_thread = threading.get_ident()
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()
        self.core.close()

    def _sweep(self) -> None:
        now = time.monotonic()
        for conn in list(self.conns):
            try:
                conn.sweep(now)
            except Exception:  # one client's trouble never stops the others
                log.exception("kafka: error checking %s", conn.peer)
                conn.abort()
        try:
            self.groups.sweep()  # (members silent past their session timeout)
            self.share_groups.sweep()
        except Exception:
            log.exception("kafka: error checking the consumer groups")
        if not self.loop.is_closed():
            self.loop.call_later(_SWEEP_S, self._sweep)

    # -- what the broker's service asks ------------------------------------------------------
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

    def connection_count(self) -> int:
        return len(self.conns)

    def waiting_for(self) -> str:
        pending = sum(c.outstanding for c in list(self.conns))
        return f"{pending} Kafka request(s) to answer" if pending else ""

    def begin_stop(self, deadline: float) -> None:
        """(The Kafka service drains in :meth:`stop`.)"""

    def stop(self, deadline: float | None = None) -> list[str]:
        """Stop accepting; with a ``deadline`` first answer what was read (produces once
        durable) until everything is or the deadline passes; then close every connection
        (Kafka clients reconnect, to the backup of a pair)."""
        if self.loop.is_closed():
            return []
        asyncio.run_coroutine_threadsafe(self._shutdown(deadline), self.loop).result()
        self._stop_loop()
        return []

    async def _shutdown(self, deadline: float | None) -> None:
        self._server.close()
        self.draining = True
        for conn in list(self.conns):
            conn.drain()
        while deadline is not None and time.monotonic() < deadline:
            if not any(c.outstanding for c in self.conns):
                break
            await asyncio.sleep(0.02)
        for conn in list(self.conns):
            conn.abort()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), 0.5)

    def committed(self) -> None:
        """(After a turn.) Come back when the earliest waiting ack is due."""
        due = self.turn.due()
        if due is None:
            return
        if self._later_at is not None:
            if self._later_at.when() <= due:
                return
            self._later_at.cancel()
        self._later_at = self.loop.call_at(due, self._commit_later)

    def _commit_later(self) -> None:
        self._later_at = None
        self.turn.commit_due()
        self.committed()
