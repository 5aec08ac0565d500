"""Which threads may wait for moments on a client's behalf.

A listener's event loop serves every client of its connections on one thread (the direct
wire's, Kafka's, STOMP's): a wait there holds all of them up. Such a loop says so at its start
(:func:`answers_at_once`), and code that would wait for moments on a client's behalf
(:meth:`spark_mq.cluster.member.ClusterMember.route`, for a destination being placed) answers
at once there instead (:func:`may_wait`). What is answered then is the transport's to carry:
the SDK and Kafka's clients ask again when told a destination is being placed; STOMP's, which
cannot, have their sends forwarded (kept in order behind one another:
:meth:`spark_mq.session.session.ClientSession.produce`) and their subscriptions attached on a
helper thread, their connection's later frames waiting behind it. Other threads (Flight's
handlers, helpers) wait as before.
"""

from __future__ import annotations

import threading

_here = threading.local()


def answers_at_once() -> None:
    """(At the start of a loop thread that serves many clients.)"""
    _here.answers_at_once = True


def may_wait() -> bool:
    """Whether this thread may wait for moments on a client's behalf."""
    return not getattr(_here, "answers_at_once", False)
