"""A broker's term: what it serves its data under. The service (:mod:`spark_mq.service`) begins
one before the broker opens its journal and ends it after the broker closed:

* the data directory's lock (one broker per data directory; a shared store's backup waits for
  it here);
* with high availability (``ha.mode``), the next ownership epoch of the data root, stamped on
  every Delta commit from then on (a broker that owned the data before commits nothing more),
  taken once a replicating backup may (it follows its primary here until then);
* a replicating primary's :class:`~spark_mq.ha.replication.Replicator`, attached to the
  journal before it opens, listening once the term is started.

The broker knows none of this: it is handed the term (its ``epoch`` and ``state()``) and opens
the journal the term fenced.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from spark_mq.config import BrokerConfig
from spark_mq.errors import ConfigError, Deposed
from spark_mq.ha import replication
from spark_mq.ha.ownership import NotEligible, Owner, Ownership
from spark_mq.ha.replication import ChannelSecurity, Follower, Replicator
from spark_mq.journal import Journal, bindings
from spark_mq.journal.delta_store import DeltaStore
from spark_mq.journal.dir_lock import DataDirLock, StoppedWaiting, lock_dir

log = logging.getLogger(__name__)


class Term:
    """The lock, the epoch and the replicator of one broker's term (see the module)."""

    def __init__(
        self,
        config: BrokerConfig,
        broker_id: str,
        lock: DataDirLock | None,
        owner: Owner | None = None,
        replicator: Replicator | None = None,
    ) -> None:
        self.config = config
        self.broker_id = broker_id
        self.lock = lock
        self.owner = owner
        self.replicator = replicator

    @property
    def epoch(self) -> int | None:
        return self.owner.epoch if self.owner is not None else None

    def state(self) -> dict[str, Any]:
        """Role, id and epoch (and the replication's state), for ping, status and metrics."""
        state: dict[str, Any] = {
            "ha_mode": self.config.ha.mode,
            "role": "primary",  # (a backup does not serve: nobody asks it)
            "broker_id": self.broker_id,
            "epoch": self.epoch,
        }
        if self.replicator is not None:
            state.update(self.replicator.stats())
        return state

    def start(self) -> None:
        """The broker serves: a replicating primary listens for its backup."""
        if self.replicator is not None:
            self.replicator.start()

    def close(self) -> None:
        """The broker closed: stop replicating, let go of the data directory."""
        if self.replicator is not None:
            self.replicator.close()
            self.replicator = None
        if self.lock is not None:
            self.lock.release()
            self.lock = None


def begin(
    config: BrokerConfig,
    journal: Journal,
    broker_id: str,
    *,
    until: threading.Event | None = None,
    on_deposed: Callable[[Deposed], None] = lambda _err: None,
    channel: ChannelSecurity | None = None,
) -> Term:
    """Begin a term over ``journal``'s data (before it opens). A shared store's backup waits
    for the data directory here, a replicating one follows its primary here, until it may take
    over (``StoppedWaiting`` if ``until`` is set first). ``on_deposed``: called (from any
    committing thread) once a broker with a greater epoch took over; ``channel``: how the
    replication channel authenticates and encrypts (the service's security)."""
    ha = config.ha
    where = lock_dir(config)
    if where is None:
        lock = None
    elif ha.mode == "shared-store":
        lock = DataDirLock(where).wait(until, ha.lock_poll_s)
    else:
        lock = DataDirLock(where).acquire()
    term = Term(config, broker_id, lock)
    store = journal.store
    if ha.mode == "none" or not isinstance(store, DeltaStore):
        return term
    listener = None
    try:
        if ha.mode == "replication":  # (the port first: see replication.listen)
            listener = replication.listen(config.broker.host, ha.replication_port, until=until)
        term.owner = owner = _take_ownership(config, store, broker_id, until, on_deposed, channel)
        if ha.mode == "replication":
            term.replicator = Replicator(
                journal,
                Ownership(store.root, store.storage_options),
                owner,
                host=config.broker.host,
                port=ha.replication_port,
                replicated_acks=ha.ack == "replicated",
                timeout_s=ha.failover_timeout_s,
                heartbeat_s=ha.heartbeat_s,
                on_deposed=on_deposed,
                channel=channel,
                listener=listener,
            )
            listener = None
            journal.replica = term.replicator
    except BaseException:
        if listener is not None:
            listener.close()
        term.close()
        raise
    return term


def _take_ownership(
    config: BrokerConfig,
    store: DeltaStore,
    broker_id: str,
    until: threading.Event | None,
    on_deposed: Callable[[Deposed], None],
    channel: ChannelSecurity | None,
) -> Owner:
    """The next ownership epoch, stamped on every Delta commit from now on (and on each
    destination's tables now): a broker that owned the data before commits nothing more."""
    if config.ha.mode == "replication":
        owner = _follow_until_owner(config, store, broker_id, until, channel)
    else:
        owner = Ownership(store.root, store.storage_options).take(broker_id)
    store.on_deposed = on_deposed
    store.fence(owner.epoch)
    infos, _ = bindings.replay(store.read_bindings())
    store.stamp_destinations(sorted(infos))
    log.info("primary: %s owns %s from now on (epoch %d)", broker_id, store.root, owner.epoch)
    return owner


def _follow_until_owner(
    config: BrokerConfig,
    store: DeltaStore,
    broker_id: str,
    until: threading.Event | None,
    channel: ChannelSecurity | None,
) -> Owner:
    """Replication: follow the peer while it is the primary (a copy of every record it has
    not moved, in this broker's own hot directory); once it is gone, take over if the ownership
    record names this broker in sync (or it owned the data last, or nobody ever did); else
    wait for the primary to come back, saying why."""
    ha = config.ha
    hot = config.hot_dir()
    if hot is None:
        raise ConfigError("replication needs a hot tier (journal.hot_dir)", setting="journal")
    follower = Follower(
        hot,
        broker_id,
        segment_bytes=config.journal.segment_bytes,
        timeout_s=ha.failover_timeout_s,
        channel=channel,
    )
    own = Ownership(store.root, store.storage_options)
    host, _, port = ha.peer.rpartition(":")

    def may_take(latest: Owner | None) -> str | None:
        if latest is None or broker_id in (latest.broker_id, latest.in_sync_backup):
            return None
        return (
            f"not in sync with {latest.broker_id} (epoch {latest.epoch}), which owned the data "
            "last: this broker may lack records it acknowledged, so it does not take over; "
            "waiting for it to come back"
        )

    said = ""
    while True:
        if ha.peer and not (until is not None and until.is_set()):
            follower.follow((host or "127.0.0.1", int(port)), until)
        if until is not None and until.is_set():
            raise StoppedWaiting("stopped while following the primary")
        try:
            return own.take(broker_id, may_take)
        except NotEligible as exc:
            if str(exc) != said:
                said = str(exc)
                log.warning("backup: %s", said)
        except Deposed:
            continue  # another broker took it this moment: follow it
        if until is not None:
            until.wait(ha.lock_poll_s)
        else:
            time.sleep(ha.lock_poll_s)
