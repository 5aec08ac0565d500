"""What a broker serves its data under, as the broker sees it: an epoch and a state to show.
The service begins it (:mod:`spark_mq.ha.term`) before the broker opens its journal and ends it
after the broker closed; the broker only asks it."""

from __future__ import annotations

from typing import Any, Protocol


class Tenure(Protocol):
    @property
    def epoch(self) -> int | None:
        """The ownership epoch every commit carries (None: not fenced)."""
        ...

    def state(self) -> dict[str, Any]:
        """``ha_mode``, ``role``, ``broker_id``, ``epoch`` and the replication's state."""
        ...
