"""Administering the broker: destinations, subscriptions and their statistics."""

from __future__ import annotations

from typing import Any

from spark_mq.client._transport import DEFAULT_URL, call_action, connect


class Admin:
    def __init__(self, url: str = DEFAULT_URL, *, timeout_s: float = 30.0) -> None:
        self._client, self._options = connect(url, timeout_s)

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()

    def _call(self, action: str, /, **body: Any) -> Any:
        return call_action(self._client, self._options, action, **body)

    def ping(self) -> bool:
        return bool(self._call("ping")["ok"])

    def create_queue(self, name: str) -> bool:
        """Create a queue; returns False if it already existed."""
        return bool(self._call("create_destination", name=name, kind="queue")["created"])

    def create_topic(self, name: str) -> bool:
        return bool(self._call("create_destination", name=name, kind="topic")["created"])

    def delete_destination(self, name: str) -> None:
        self._call("delete_destination", name=name)

    def list_destinations(self) -> list[dict[str, Any]]:
        return list(self._call("list_destinations"))

    def create_subscription(self, topic: str, name: str) -> bool:
        """A durable subscription: it keeps every message published from now on until acked."""
        return bool(self._call("create_subscription", destination=topic, name=name)["created"])

    def delete_subscription(self, topic: str, name: str) -> None:
        self._call("delete_subscription", destination=topic, name=name)

    def stats(self, name: str) -> dict[str, Any]:
        return dict(self._call("stats", name=name))
