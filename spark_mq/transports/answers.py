"""The answer to a produced batch, the same on every transport that answers batches (Flight's
produce stream, the direct wire)."""

from __future__ import annotations

import json
from concurrent.futures import Future

from spark_mq import protocol
from spark_mq.commands import ProduceResult
from spark_mq.errors import SparkMQError, to_wire
from spark_mq.protocol import PutAck, PutFailed


def put_answer(seq: int, fut: Future) -> protocol.Frame:
    """The answer to produced batch ``seq`` whose future is done (any transport)."""
    try:
        res = fut.result()
        if isinstance(res, ProduceResult):
            first = res.offsets[0] if res.offsets else 0
            return PutAck(seq, first, len(res.offsets), tuple(res.offsets), res.duplicates)
        return PutAck(seq, res.first_offset, res.count)
    except Exception as exc:
        err = exc if isinstance(exc, SparkMQError) else SparkMQError(f"internal error: {exc}")
        return PutFailed(seq, json.loads(to_wire(err)))
