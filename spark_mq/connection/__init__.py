"""The connection core: what every listener (the direct wire, STOMP, and Flight where gRPC's
model allows) does the same way, whatever its codec and however it moves bytes.

* :mod:`~spark_mq.connection.gateway`: the listeners' way into the broker (logins, sessions,
  what a listener needs to know of the broker), handed to each by the service;
* :mod:`~spark_mq.connection.core`: one connection: its state (one enum), login, session,
  deadlines as a pure ``check(now)``, heartbeats, produce dispatch, revocation;
* :mod:`~spark_mq.connection.listener`: what a listener shares between its connections (the
  cap, helper threads for work that may wait, the turn's inline commit, drain), and the
  :class:`~spark_mq.connection.listener.Listener` protocol the service starts and stops.

A transport (:mod:`spark_mq.transports`) is its codec and its I/O; it reaches the broker only
through its connections' sessions.
"""
