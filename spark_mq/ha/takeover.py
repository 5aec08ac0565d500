"""How a broker with high availability on comes to own its data root, at its start: a shared
store's backup has already waited for the data directory's lock; a replicating backup follows
its primary here until it may take over. Then the next epoch is taken and every table fenced.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from spark_mq.broker.dir_lock import StoppedWaiting
from spark_mq.config import BrokerConfig
from spark_mq.errors import Deposed
from spark_mq.ha.ownership import NotEligible, Owner, Ownership
from spark_mq.ha.replication import Follower, Replicator
from spark_mq.journal import Journal, bindings
from spark_mq.journal.delta_store import DeltaStore

if TYPE_CHECKING:
    from spark_mq.security.context import Security

log = logging.getLogger(__name__)


def take_ownership(
    config: BrokerConfig,
    store: DeltaStore,
    broker_id: str,
    until: threading.Event | None,
    on_deposed: Callable[[Deposed], None],
) -> Owner:
    """The next ownership epoch, stamped on every Delta commit from now on (and on each
    destination's tables now): a broker that owned the data before commits nothing more."""
    if config.ha.mode == "replication":
        owner = _follow_until_owner(config, store, broker_id, until)
    else:
        owner = Ownership(store.root, store.storage_options).take(broker_id)
    store.on_deposed = on_deposed
    store.fence(owner.epoch)
    infos, _ = bindings.replay(store.read_bindings())
    store.stamp_destinations(sorted(infos))
    log.info("primary: %s owns %s from now on (epoch %d)", broker_id, store.root, owner.epoch)
    return owner


def replicator(
    config: BrokerConfig,
    journal: Journal,
    store: DeltaStore,
    owner: Owner,
    on_deposed: Callable[[Deposed], None],
    security: Security | None,
    listener: socket.socket | None = None,
) -> Replicator:
    """A replicating primary's end of the pair (listening once started)."""
    ha = config.ha
    return Replicator(
        journal,
        Ownership(store.root, store.storage_options),
        owner,
        host=config.broker.host,
        port=ha.replication_port,
        replicated_acks=ha.ack == "replicated",
        timeout_s=ha.failover_timeout_s,
        heartbeat_s=ha.heartbeat_s,
        on_deposed=on_deposed,
        security=security,
        listener=listener,
    )


def _follow_until_owner(
    config: BrokerConfig, store: DeltaStore, broker_id: str, until: threading.Event | None
) -> Owner:
    """Replication: follow the peer while it is the primary (a copy of every record it has
    not moved, in this broker's own hot directory); once it is gone, take over if the ownership
    record names this broker in sync (or it owned the data last, or nobody ever did); else
    wait for the primary to come back, saying why."""
    ha = config.ha
    hot = config.hot_dir()
    assert hot is not None
    follower = Follower(
        hot,
        broker_id,
        segment_bytes=config.journal.segment_bytes,
        timeout_s=ha.failover_timeout_s,
        tls=bool(config.security.tls_cert_file),
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
