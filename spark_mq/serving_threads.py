"""Which threads may wait for moments on a client's behalf.

A listener's event loop serves every client of its connections on one thread (the direct
wire's, Kafka's): a wait there holds all of them up. When its clients can follow a cluster's
answers on their own (the SDK and Kafka's clients ask again when told a destination is being
placed), the loop says so at its start (:func:`clients_ask_again`), and code that would wait
for moments on a client's behalf (:meth:`spark_mq.cluster.member.ClusterMember.route`) answers
at once there instead (:func:`may_wait`). Other threads (Flight's handlers, helpers, STOMP's
loop, whose clients cannot follow) wait as before.
"""

from __future__ import annotations

import threading

_here = threading.local()


def clients_ask_again() -> None:
    """(At the start of a loop thread whose clients ask again when told to.)"""
    _here.answers_at_once = True


def may_wait() -> bool:
    """Whether this thread may wait for moments on a client's behalf."""
    return not getattr(_here, "answers_at_once", False)
