"""A produce stream's batches keep their order when their destination moves (a cluster).

A client writes batches to a stream one after another without waiting for their answers. A
cluster member refuses one of them, ``NotOwner``: another member owns the destination now, or
it is being placed here just now. The client sends that batch again on a new stream, where
the destination is served. But a batch written after it, already on its way, may find the
destination served here by the time it arrives (the member finished taking it on): stored,
it would come before the one refused, and a group's order would be broken.

So once a stream has had a batch refused that way, every later batch on it is refused too,
and none is stored: the client sends them again after the refused one, in order, on its new
stream. The SDK opens that stream at the first such refusal. The direct wire and Flight each
keep one of these per produce stream.

A batch refused later, through its future (the journal let the destination go after the batch
was taken, before it was committed), counts as well, from when its future fails: a batch taken
before that (the same loop turn) fails with it.
"""

from __future__ import annotations

from concurrent.futures import Future

from spark_mq.errors import NotOwner, SparkMQError


class ProduceOrder:
    """One produce stream's refusals: ``check()`` before a batch is produced, ``refused()``
    when producing it raised."""

    __slots__ = ("_refused",)

    def __init__(self) -> None:
        self._refused: NotOwner | None = None

    def check(self) -> None:
        """Raise ``NotOwner`` if a batch before this one on the stream was refused so."""
        first = self._refused
        if first is not None:
            raise NotOwner(
                f"{first.message} (a batch before this one on the stream was refused so: send "
                "them again, in order, on a new stream)",
                **first.fields,
            )

    def refused(self, exc: SparkMQError) -> None:
        """A batch of the stream was refused with ``exc``."""
        if self._refused is None and isinstance(exc, NotOwner):
            self._refused = exc

    def refused_through(self, fut: Future) -> None:
        """(A batch's future, done.) :meth:`refused` when it failed."""
        exc = fut.exception()
        if isinstance(exc, SparkMQError):
            self.refused(exc)
