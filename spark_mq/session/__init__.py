"""The session layer: every transport's way into the broker.

A transport authenticates a connection (or a call), opens a :class:`ClientSession` for the
principal, turns frames into the broker's commands (:mod:`spark_mq.commands`) and
hands them to the session, which authorizes each one, counts it and passes it to the broker;
results come back as the broker's types, which the transport turns into frames. The
connection's lifecycle (open, serve, close: its consumers detached, their messages back) is
the session's, written once.
"""

from spark_mq.session.consumer import ConsumerHandle
from spark_mq.session.guard import OPEN, Guard, Verb
from spark_mq.session.principal import ANONYMOUS, Principal
from spark_mq.session.session import ClientSession

__all__ = ["ANONYMOUS", "OPEN", "ClientSession", "ConsumerHandle", "Guard", "Principal", "Verb"]
