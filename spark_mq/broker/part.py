"""What the parts of :class:`spark_mq.broker.core.Broker` mixed into it
(:mod:`~spark_mq.broker.admin_ops`, :mod:`~spark_mq.broker.attaching`) rely on: its state and
the builders ``core`` defines, declared once for the type checker."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark_mq.broker.destination import Destination
    from spark_mq.broker.selector import Selector
    from spark_mq.broker.subscription import Subscription
    from spark_mq.clock import Clock
    from spark_mq.config import BrokerConfig
    from spark_mq.journal import Journal
    from spark_mq.journal.base import Kind


class BrokerPart:
    _lock: threading.RLock
    _dests: dict[str, Destination]
    journal: Journal
    config: BrokerConfig
    clock: Clock

    if TYPE_CHECKING:  # the broker's own builders (core.py)

        def ha_state(self) -> dict[str, Any]: ...
        def _new_destination(
            self, name: str, kind: Kind, overrides: dict[str, Any] | None = None
        ) -> Destination: ...
        def _subscription(
            self,
            dest: Destination,
            name: str,
            start: int,
            *,
            next_offset: int,
            settled: set[int],
            returned: dict[int, int] | None = None,
            selector: Selector | None = None,
            durable: bool = True,
        ) -> Subscription: ...
