"""How one sent batch ended, whichever transport carried it."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future

from spark_mq import protocol
from spark_mq.errors import LeaseError, NotOwner, ProtocolError, SparkMQError, from_wire


def refusals(reply: protocol.Reply) -> dict[int, str]:
    """The offsets a settle's reply refused, and why."""
    return {e["offset"]: e.get("reason", "refused") for e in reply.errors if "offset" in e}


def coming_again(reply: protocol.Reply) -> frozenset[int]:
    """The refused offsets whose messages are delivered again (their destination moved on, or
    its owner could not be reached): the client erred in nothing."""
    return frozenset(e["offset"] for e in reply.errors if e.get("again") and "offset" in e)


def refused_for_a_move(frame: protocol.Frame) -> bool:
    """Whether a produce's answer is ``NotOwner``: its stream refuses every batch after it too
    (:mod:`spark_mq.connection.produce_order`), so the producer opens a new one."""
    return isinstance(frame, protocol.PutFailed) and frame.error.get("code") == NotOwner.code


def settle_refusal(
    refused: dict[int, str],
    offsets: Sequence[int],
    destination: str,
    again: frozenset[int] = frozenset(),
) -> LeaseError | None:
    """What one settle call (``offsets``: a list, or a batch's array) came to: None when none
    was refused, else the ``LeaseError`` naming the first refused one; its ``comes_again``
    says whether every refused message is delivered again (``again``: :func:`coming_again`)."""
    if not refused:  # (the usual reply: not a look-up an offset, 2,000 for a batch's ack)
        return None
    bad = [(o, refused[o]) for o in map(int, offsets) if o in refused]
    if not bad:
        return None
    return LeaseError(
        f"{len(bad)} of {len(offsets)} settle(s) refused: offset {bad[0][0]}: {bad[0][1]}",
        destination=destination,
        offset=bad[0][0],
        comes_again=all(o in again for o, _ in bad),
    )


class Outcome:
    """Who hears how one sent batch ended: a future per message (``send``) or one for the batch.

    ``send_batch`` uses the single future, resolved to the list of offsets; a future per
    message would cost more than the rest of the client's work for a 1,000-message batch.
    """

    __slots__ = ("per_message", "rows", "whole")

    def __init__(
        self, rows: int, per_message: list[Future] | None = None, whole: Future | None = None
    ) -> None:
        self.rows, self.per_message, self.whole = rows, per_message, whole

    def answer(self, frame: protocol.Frame) -> None:
        """Resolve or fail from the broker's answer (``PutAck`` / ``PutFailed``)."""
        match frame:
            case protocol.PutAck(first_offset=first, count=count, offsets=offsets) if (
                count == self.rows and (offsets is None or len(offsets) == count)
            ):
                self.resolve(first, offsets)
            case protocol.PutFailed(error=error):
                self.fail(from_wire(protocol.encode_action_body(**error), "produce failed"))
            case _:
                raise ProtocolError(f"unexpected answer to a produce: {frame}", fault="remote")

    def resolve(self, first: int, offsets: tuple[int, ...] | None = None) -> None:
        """Rows have ``first`` onwards, or ``offsets`` (a duplicate has its original's)."""
        listed = list(offsets) if offsets is not None else range(first, first + self.rows)
        if self.per_message is not None:
            for f, offset in zip(self.per_message, listed, strict=True):
                f.set_result(offset)
        if self.whole is not None:
            self.whole.set_result(list(listed))

    def fail(self, err: SparkMQError) -> None:
        for f in [*(self.per_message or ()), *([self.whole] if self.whole else [])]:
            if not f.done():
                f.set_exception(err)
