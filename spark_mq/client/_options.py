"""Checks of a message's options made where it is sent (producers, transactions), so a bad
one is refused on its own instead of failing the batch it would have joined."""

from __future__ import annotations

from spark_mq.errors import MessageRejected


def check_options(
    priority: int | None, ttl_s: float | None, delay_s: float | None, destination: str
) -> None:
    """Refuse a message's options at ``send`` (as the broker would), before it joins a batch
    whose other messages it would fail with it."""
    if priority is not None and (
        isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 9
    ):
        raise MessageRejected(
            f"priority must be an integer from 0 to 9, got {priority!r}", destination=destination
        )
    for value, name in ((ttl_s, "ttl_s"), (delay_s, "delay_s")):
        if value is not None and not value >= 0:  # (NaN is refused too)
            raise MessageRejected(
                f"{name} must be a number of seconds, 0 or more, got {value!r}",
                destination=destination,
            )
