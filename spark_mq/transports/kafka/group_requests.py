"""What a Kafka connection's consumer-group requests mean: FindCoordinator (this broker),
JoinGroup, SyncGroup, Heartbeat and LeaveGroup (the listener's
:class:`~spark_mq.transports.kafka.groups.Coordinator`), OffsetCommit and OffsetFetch (the
session's committed offsets, durable in the journal), ListGroups, DescribeGroups and
DeleteGroups.

A group is a resource of its own (Kafka's ``GROUP``; the access rules' ``groups``): joining it,
committing and reading its offsets and describing it need ``consume`` on the group, deleting it
or its offsets ``admin`` (otherwise ``GROUP_AUTHORIZATION_FAILED``); its offsets are committed and
read only for topics the principal may consume (otherwise ``TOPIC_AUTHORIZATION_FAILED`` for that
topic). ListGroups lists the groups the principal may use.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

from spark_mq.connection.listener import ListenerCore
from spark_mq.errors import Deposed, NotOwner, SparkMQError
from spark_mq.session import ClientSession, Verb
from spark_mq.transports.kafka import codec
from spark_mq.transports.kafka.codec import ErrorCode, Request, build
from spark_mq.transports.kafka.groups import Coordinator, Joined, Synced
from spark_mq.transports.kafka.link import KafkaLink, error_code, group_refused
from spark_mq.transports.kafka.share import ShareGroups
from spark_mq.transports.kafka.transactions import ProducerTransactions

log = logging.getLogger(__name__)

_ZERO = timedelta(0)
_NO_OPERATIONS = -(2**31)
_PLACED_POLL_S = 0.02  # how often a FindCoordinator waiting for the offsets' placement looks


# an OffsetFetch's answer for a group: its error, and each topic's (partition, offset,
# metadata, error)
_Fetched = tuple[str, ErrorCode, list[tuple[str, list[tuple[int, int, str | None, ErrorCode]]]]]


def _group_error(exc: SparkMQError) -> ErrorCode:
    """A group request's error: the offsets moved to another cluster member meanwhile (it
    said so, or its fence refused the commit) is ``NOT_COORDINATOR``, not a topic's
    ``NOT_LEADER_OR_FOLLOWER``."""
    return ErrorCode.not_coordinator if isinstance(exc, (NotOwner, Deposed)) else error_code(exc)


def _seconds(value: object, default: float) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else default


class GroupRequests:
    def __init__(
        self,
        link: KafkaLink,
        listener: ListenerCore,
        session: ClientSession,
        coordinator: Coordinator,
        share_groups: ShareGroups | None = None,
        transactions: ProducerTransactions | None = None,
    ) -> None:
        self.link = link
        self.listener = listener
        self.session = session
        self.groups = coordinator
        self.share_groups = share_groups
        self.transactions = transactions  # (offsets an open transaction commits: unstable)
        self._placing: Future | None = None  # (a cluster's offsets topic, being created)

    def handlers(self) -> dict[int, Callable[[Request, Any], None]]:
        return {
            codec.FIND_COORDINATOR: self._find_coordinator,
            codec.JOIN_GROUP: self._join,
            codec.SYNC_GROUP: self._sync,
            codec.HEARTBEAT: self._heartbeat,
            codec.LEAVE_GROUP: self._leave,
            codec.OFFSET_COMMIT: self._offset_commit,
            codec.OFFSET_FETCH: self._offset_fetch,
            codec.LIST_GROUPS: self._list_groups,
            codec.DESCRIBE_GROUPS: self._describe_groups,
            codec.DELETE_GROUPS: self._delete_groups,
            codec.OFFSET_DELETE: self._offset_delete,
        }

    def _refused(self, group: str, verb: Verb = "consume") -> bool:
        return group_refused(self.session, group, verb)

    def _module(self, r: Request) -> Any:
        return codec.response_module(r.api_key, r.version)

    # -- FindCoordinator: this broker, or the cluster member serving the offsets -----------
    def _find_coordinator(self, r: Request, slot: Any) -> None:
        if self.link.nodes.coordinator() is None:
            # (a cluster's offsets topic, being placed: answered once it is, a moment later.
            # "Not available" at once, librdkafka asked again a second later: a new cluster's
            # first group waited that long for its coordinator)
            self._offsets_placed()
            self.link.awaiting(
                self._coordinator_known(),
                lambda _: self._coordinator_answer(r, slot),
                on_error=lambda _: self._coordinator_answer(r, slot),
            )
            return
        self._coordinator_answer(r, slot)

    def _coordinator_known(self) -> Future:
        """Done once the groups' coordinator is known, or after ``cluster.placement_wait_s``
        (the asker is then told it is not available yet). Looked at by the loop's timer, not
        a helper thread: the connections asking at once, when the coordinating member died,
        would hold every helper (their reads of the log too)."""
        known: Future = Future()
        deadline = time.monotonic() + self.link.nodes.placement_wait_s

        def look() -> None:
            if self.link.nodes.coordinator() is not None or time.monotonic() >= deadline:
                known.set_result(None)
            else:
                self.link.loop.call_later(_PLACED_POLL_S, look)

        look()
        return known

    def _coordinator_answer(self, r: Request, slot: Any) -> None:
        body, mod = r.body, self._module(r)
        key_type = getattr(body, "key_type", 0)
        node = self.link.nodes.coordinator()
        # (a transaction's coordinator is the groups': key type 1)
        err, message = ErrorCode.none, None
        if key_type not in (0, 1):
            err, message = ErrorCode.invalid_request, f"no coordinators of key type {key_type}"
        elif node is None:  # (still being placed: clients ask again)
            err, message = ErrorCode.coordinator_not_available, "being placed"
        node_id, host, port = (node.node_id, node.host, node.port) if node else (-1, "", -1)
        if r.version >= 4:
            coordinators = tuple(
                build(
                    mod,
                    "Coordinator",
                    key=k,
                    node_id=node_id,
                    host=host,
                    port=port,
                    error_code=err,
                    error_message=message,
                )
                for k in body.coordinator_keys
            )
            response = build(
                mod, "FindCoordinatorResponse", throttle_time=_ZERO, coordinators=coordinators
            )
        else:
            response = build(
                mod,
                "FindCoordinatorResponse",
                throttle_time=_ZERO,
                error_code=err,
                error_message=message,
                node_id=node_id,
                host=host,
                port=port,
            )
        self.link.answer(slot, response)

    def _offsets_placed(self) -> None:
        """(A cluster's.) The groups' offsets topic created, when it was not: it is placed on a
        member, which coordinates every group from then on. Off the loop (it is recorded in
        the journal and registered in ZooKeeper)."""
        if self._placing is not None and not self._placing.done():
            return
        self._placing = self.listener.run_blocking(self.session.offsets_placed)

    def _not_coordinating(self) -> bool:
        """A cluster member not serving the groups' offsets: it answers ``NOT_COORDINATOR``
        (the client asks FindCoordinator again)."""
        return not self.link.nodes.coordinating()

    # -- a cluster's: memberships read back when the offsets came here ----------------------
    def _deferred(self, again: Callable[[], None]) -> bool:
        """(A cluster member coordinating.) True when the groups' memberships kept beside
        their offsets are being read back (the offsets topic came here since they were last
        read): ``again()`` (the request, handled anew) runs once they are. A read that fails
        (the topic moved on meanwhile) is tried again shortly; the request then says
        ``NOT_COORDINATOR`` if it is not here any more."""
        if not self.link.nodes.clustered:
            return False
        groups = self.groups
        if not groups.loading and groups.term == self.session.groups_term():
            return False
        groups.waiting.append(again)
        if groups.loading:
            return True
        groups.loading = True
        loop = groups.loop
        fut = self.listener.run_blocking(self.session.group_memberships)

        def read() -> None:
            groups.loading = False
            waiting, groups.waiting = groups.waiting, []
            exc = fut.exception()
            if exc is None:
                term, memberships = fut.result()
                groups.restore(memberships, term)
                for handle in waiting:
                    handle()
                return
            log.info("kafka: reading the groups' memberships failed (%s): trying again", exc)
            for handle in waiting:
                loop.call_later(0.2, handle)

        fut.add_done_callback(lambda _: loop.call_soon_threadsafe(read))
        return True

    def _keep(self, group: str) -> None:
        """(A cluster member coordinating.) ``group``'s membership kept beside its offsets as it
        is now (stable, or empty), off the loop and after the one kept before (in order); a
        failure is only logged (its members join again after a move, as before)."""
        if not self.link.nodes.clustered:
            return
        snapshot, session, before = self.groups.snapshot(group), self.session, self.groups.kept

        def keep() -> None:
            if before is not None:
                with contextlib.suppress(Exception):
                    before.result(timeout=30)
            session.keep_group_membership(group, snapshot).result(timeout=30)

        def kept(f: Future) -> None:
            exc = f.exception()
            if exc is not None and not isinstance(exc, NotOwner | Deposed):
                log.warning("kafka: keeping group %s's membership failed: %s", group, exc)

        self.groups.kept = fut = self.listener.run_blocking(keep)
        fut.add_done_callback(kept)
        if snapshot is None:
            self.groups.keepers.pop(group, None)
        else:  # (a group the sweep empties is kept so through this connection's session)
            self.groups.keepers[group] = self._keep

    # -- JoinGroup, SyncGroup, Heartbeat, LeaveGroup ----------------------------------------
    def _join(self, r: Request, slot: Any) -> None:
        body, mod = r.body, self._module(r)
        session_s = _seconds(body.session_timeout, 10.0)
        rebalance_s = _seconds(getattr(body, "rebalance_timeout", None), session_s)

        def respond(j: Joined) -> None:
            members = tuple(
                build(
                    mod,
                    "JoinGroupResponseMember",
                    member_id=m,
                    group_instance_id=None,
                    metadata=meta,
                )
                for m, meta in j.members
            )
            self.link.answer(
                slot,
                build(
                    mod,
                    "JoinGroupResponse",
                    throttle_time=_ZERO,
                    error_code=j.error,
                    generation_id=j.generation,
                    protocol_type=j.protocol_type,
                    protocol_name=j.protocol or "",
                    leader=j.leader,
                    skip_assignment=False,
                    member_id=j.member_id,
                    members=members,
                ),
            )

        if self._refused(body.group_id):
            respond(Joined(ErrorCode.group_authorization_failed, body.member_id))
            return
        if self._not_coordinating():
            respond(Joined(ErrorCode.not_coordinator, body.member_id))
            return
        if self._deferred(lambda: self._join(r, slot)):
            return
        self.groups.join(
            body.group_id,
            body.member_id,
            client_id=r.client_id or "",
            host=self.link.peer,
            session_timeout_s=session_s,
            rebalance_timeout_s=rebalance_s,
            protocol_type=body.protocol_type,
            protocols=[(p.name, bytes(p.metadata)) for p in body.protocols],
            member_id_required=r.version >= 4,
            respond=respond,
        )

    def _sync(self, r: Request, slot: Any) -> None:
        body, mod = r.body, self._module(r)

        def respond(s: Synced) -> None:
            self.link.answer(
                slot,
                build(
                    mod,
                    "SyncGroupResponse",
                    throttle_time=_ZERO,
                    error_code=s.error,
                    protocol_type=s.protocol_type,
                    protocol_name=s.protocol,
                    assignment=s.assignment,
                ),
            )

        if self._refused(body.group_id):
            respond(Synced(ErrorCode.group_authorization_failed))
            return
        if self._not_coordinating():
            respond(Synced(ErrorCode.not_coordinator))
            return
        if self._deferred(lambda: self._sync(r, slot)):
            return
        assignments = {a.member_id: bytes(a.assignment) for a in body.assignments}
        if self.groups.sync(
            body.group_id, body.generation_id, body.member_id, assignments, respond
        ):
            self._keep(body.group_id)

    def _heartbeat(self, r: Request, slot: Any) -> None:
        body, mod = r.body, self._module(r)
        if self._refused(body.group_id):
            err = ErrorCode.group_authorization_failed
        elif self._not_coordinating():
            err = ErrorCode.not_coordinator
        elif self._deferred(lambda: self._heartbeat(r, slot)):
            return
        else:
            err = self.groups.heartbeat(body.group_id, body.generation_id, body.member_id)
        self.link.answer(slot, build(mod, "HeartbeatResponse", throttle_time=_ZERO, error_code=err))

    def _leave(self, r: Request, slot: Any) -> None:
        body, mod = r.body, self._module(r)
        refused = self._refused(body.group_id)
        if refused or self._not_coordinating():
            self.link.answer(
                slot,
                build(
                    mod,
                    "LeaveGroupResponse",
                    throttle_time=_ZERO,
                    error_code=ErrorCode.group_authorization_failed
                    if refused
                    else ErrorCode.not_coordinator,
                    members=(),
                ),
            )
            return
        if self._deferred(lambda: self._leave(r, slot)):
            return
        if r.version >= 3:
            ids = [m.member_id for m in body.members]
            errors = self.groups.leave(body.group_id, ids)
            members = tuple(
                build(mod, "MemberResponse", member_id=m, group_instance_id=None, error_code=e)
                for m, e in zip(ids, errors, strict=True)
            )
            response = build(
                mod,
                "LeaveGroupResponse",
                throttle_time=_ZERO,
                error_code=ErrorCode.none,
                members=members,
            )
        else:
            (err,) = self.groups.leave(body.group_id, [body.member_id])
            response = build(mod, "LeaveGroupResponse", throttle_time=_ZERO, error_code=err)
        if self.groups.empty(body.group_id):  # (kept so; the others' rebalance keeps theirs)
            self._keep(body.group_id)
        self.link.answer(slot, response)

    # -- OffsetCommit, OffsetFetch -------------------------------------------------------------
    def _offset_commit(self, r: Request, slot: Any) -> None:
        body, mod = r.body, self._module(r)
        group = body.group_id
        if self._refused(group):
            checked = ErrorCode.group_authorization_failed
        elif self._not_coordinating():
            checked = ErrorCode.not_coordinator
        elif self._deferred(lambda: self._offset_commit(r, slot)):
            return
        else:
            checked = self.groups.check_commit(
                group, body.generation_id_or_member_epoch, body.member_id
            )
        asked = [
            (
                t.name,
                [
                    (p.partition_index, p.committed_offset, p.committed_metadata)
                    for p in t.partitions
                ],
            )
            for t in body.topics
        ]
        session = self.session

        def commit() -> dict[str, ErrorCode]:
            """(A helper thread: the offsets are read back from the journal at first use.)"""
            outcome: dict[str, ErrorCode] = {}
            pending = []
            for topic, parts in asked:
                if checked is not ErrorCode.none:
                    outcome[topic] = checked
                    continue
                try:
                    pending.append(
                        (
                            topic,
                            session.commit_offsets(group, [(topic, i, o, m) for i, o, m in parts]),
                        )
                    )
                except SparkMQError as exc:
                    outcome[topic] = _group_error(exc)
            return _waited(outcome, pending)

        def answer(outcome: dict[str, ErrorCode]) -> None:
            topics = tuple(
                build(
                    mod,
                    "OffsetCommitResponseTopic",
                    name=topic,
                    partitions=tuple(
                        build(
                            mod,
                            "OffsetCommitResponsePartition",
                            partition_index=i,
                            error_code=outcome[topic],
                        )
                        for i, _, _ in parts
                    ),
                )
                for topic, parts in asked
            )
            self.link.answer(
                slot, build(mod, "OffsetCommitResponse", throttle_time=_ZERO, topics=topics)
            )

        self._off_loop(commit, answer, slot)

    def _offset_fetch(self, r: Request, slot: Any) -> None:
        body, mod = r.body, self._module(r)
        if r.version >= 8:
            asked = [(g.group_id, g.topics) for g in body.groups]
        else:
            asked = [(body.group_id, body.topics)]
        session = self.session
        coordinating = not self._not_coordinating()
        # (KIP-447: a consumer asking for stable offsets is told to ask again while a
        # transaction that commits its group's offsets is open)
        unstable = {
            group: self.transactions.pending_offsets(group)
            for group, _ in asked
            if self.transactions is not None and getattr(body, "require_stable", False)
        }

        def look() -> list[_Fetched]:
            out: list[_Fetched] = []
            for group, topics in asked:
                if self._refused(group):
                    out.append((group, ErrorCode.group_authorization_failed, []))
                    continue
                if not coordinating:
                    out.append((group, ErrorCode.not_coordinator, []))
                    continue
                try:
                    committed = session.committed_offsets(group)
                except SparkMQError as exc:
                    out.append((group, _group_error(exc), []))
                    continue
                if topics is None:  # (every topic it committed)
                    names: dict[str, list[int]] = {}
                    for topic, index in sorted(committed):
                        names.setdefault(topic, []).append(index)
                    wanted = list(names.items())
                else:
                    wanted = [(t.name, list(t.partition_indexes)) for t in topics]
                result = []
                for topic, indexes in wanted:
                    parts = []
                    for index in indexes:
                        offset, metadata = committed.get((topic, index), (-1, None))
                        err = ErrorCode.none
                        if offset < 0 and not session.may_consume(topic):
                            err = ErrorCode.topic_authorization_failed
                        elif (topic, index) in unstable.get(group, ()):
                            err = ErrorCode.unstable_offset_commit
                        parts.append((index, offset, metadata, err))
                    result.append((topic, parts))
                out.append((group, ErrorCode.none, result))
            return out

        def answer(found: list[Any]) -> None:
            def topics_of(result: list[Any], names: tuple[str, str, str]) -> tuple[Any, ...]:
                topic_cls, part_cls = names[0], names[1]
                return tuple(
                    build(
                        mod,
                        topic_cls,
                        name=topic,
                        partitions=tuple(
                            build(
                                mod,
                                part_cls,
                                partition_index=i,
                                committed_offset=o,
                                committed_leader_epoch=-1,
                                metadata=m or "",
                                error_code=e,
                            )
                            for i, o, m, e in parts
                        ),
                    )
                    for topic, parts in result
                )

            if r.version >= 8:
                groups = tuple(
                    build(
                        mod,
                        "OffsetFetchResponseGroup",
                        group_id=g,
                        error_code=err,
                        topics=topics_of(
                            res, ("OffsetFetchResponseTopics", "OffsetFetchResponsePartitions", "")
                        ),
                    )
                    for g, err, res in found
                )
                response = build(mod, "OffsetFetchResponse", throttle_time=_ZERO, groups=groups)
            else:
                _, err, res = found[0]
                response = build(
                    mod,
                    "OffsetFetchResponse",
                    throttle_time=_ZERO,
                    error_code=err,
                    topics=topics_of(
                        res, ("OffsetFetchResponseTopic", "OffsetFetchResponsePartition", "")
                    ),
                )
            self.link.answer(slot, response)

        self._off_loop(look, answer, slot)

    # -- ListGroups, DescribeGroups, DeleteGroups --------------------------------------------
    def _list_groups(self, r: Request, slot: Any) -> None:
        """Classic groups; from v5 (which says each group's type) share groups too."""
        mod = self._module(r)
        wanted = set(getattr(r.body, "states_filter", ()) or ())
        types = {t.lower() for t in getattr(r.body, "types_filter", ()) or ()}
        found = [
            (g.id, g.protocol_type or "", g.state.value, "classic") for g in self.groups.listed()
        ]
        if r.version >= 5 and self.share_groups is not None:
            found += [
                (g.id, "share", "Stable" if g.members else "Empty", "share")
                for g in self.share_groups.groups.values()
            ]
        listed = tuple(
            build(
                mod,
                "ListedGroup",
                group_id=group_id,
                protocol_type=protocol_type,
                group_state=state,
                group_type=kind,
            )
            for group_id, protocol_type, state, kind in found
            if (not wanted or state in wanted)
            and (not types or kind in types)
            and self.session.may_group("consume", group_id)
        )
        self.link.answer(
            slot,
            build(
                mod,
                "ListGroupsResponse",
                throttle_time=_ZERO,
                error_code=ErrorCode.none,
                groups=listed,
            ),
        )

    def _describe_groups(self, r: Request, slot: Any) -> None:
        mod = self._module(r)
        out = []
        for group_id in r.body.groups:
            if self._refused(group_id):
                out.append(
                    build(
                        mod,
                        "DescribedGroup",
                        error_code=ErrorCode.group_authorization_failed,
                        group_id=group_id,
                        group_state="",
                        protocol_type="",
                        protocol_data="",
                        members=(),
                        authorized_operations=_NO_OPERATIONS,
                    )
                )
                continue
            d = self.groups.describe(group_id)
            g = next((x for x in self.groups.listed() if x.id == group_id), None)
            members = ()
            if g is not None:
                members = tuple(
                    build(
                        mod,
                        "DescribedGroupMember",
                        member_id=m.id,
                        group_instance_id=None,
                        client_id=m.client_id,
                        client_host=m.host,
                        member_metadata=m.metadata(g.protocol or ""),
                        member_assignment=m.assignment,
                    )
                    for m in g.members.values()
                )
            out.append(
                build(
                    mod,
                    "DescribedGroup",
                    error_code=ErrorCode.none,
                    group_id=group_id,
                    group_state=str(d["state"]) if d else "Dead",
                    protocol_type=str(d["protocol_type"]) if d else "",
                    protocol_data=str(d["protocol"]) if d else "",
                    members=members,
                    authorized_operations=_NO_OPERATIONS,
                )
            )
        self.link.answer(
            slot, build(mod, "DescribeGroupsResponse", throttle_time=_ZERO, groups=tuple(out))
        )

    def _delete_groups(self, r: Request, slot: Any) -> None:
        """A group without members is forgotten, and its committed offsets deleted (durably,
        before the answer)."""
        mod = self._module(r)
        names = list(r.body.groups_names)
        first: dict[str, ErrorCode] = {}
        for g in names:
            if self._refused(g, "admin"):
                first[g] = ErrorCode.group_authorization_failed
            else:
                first[g] = self.groups.forget(g)
                if first[g] is ErrorCode.none:
                    self._keep(g)  # (its membership, if one was kept: none now)
        session = self.session

        def delete() -> dict[str, ErrorCode]:
            outcome = dict(first)
            pending = []
            for g in names:
                if outcome[g] is ErrorCode.none:
                    try:
                        pending.append((g, session.delete_offsets(g)))
                    except SparkMQError as exc:
                        outcome[g] = error_code(exc)
            return _waited(outcome, pending)

        def answer(outcome: dict[str, ErrorCode]) -> None:
            results = tuple(
                build(mod, "DeletableGroupResult", group_id=g, error_code=outcome[g]) for g in names
            )
            self.link.answer(
                slot, build(mod, "DeleteGroupsResponse", throttle_time=_ZERO, results=results)
            )

        self._off_loop(delete, answer, slot)

    def _offset_delete(self, r: Request, slot: Any) -> None:
        """OffsetDelete: ``admin`` on the group and ``consume`` on each topic; refused for a
        topic the group's members are subscribed to (GROUP_SUBSCRIBED_TO_TOPIC), as Kafka."""
        body, mod = r.body, self._module(r)
        group = body.group_id
        asked = [(t.name, [p.partition_index for p in t.partitions]) for t in body.topics]
        top = ErrorCode.none
        if self._refused(group, "admin"):
            top = ErrorCode.group_authorization_failed
        subscribed = self.groups.subscribed_topics(group)
        session = self.session

        def delete() -> dict[str, ErrorCode]:
            outcome: dict[str, ErrorCode] = {}
            pending = []
            for topic, indexes in asked:
                if top is not ErrorCode.none:
                    outcome[topic] = top
                elif not session.may_consume(topic):
                    outcome[topic] = ErrorCode.topic_authorization_failed
                elif topic in subscribed:
                    outcome[topic] = ErrorCode.group_subscribed_to_topic
                else:
                    try:
                        fut = session.delete_offsets(group, [(topic, i) for i in indexes])
                    except SparkMQError as exc:
                        outcome[topic] = error_code(exc)
                        continue
                    pending.append((topic, fut))
            return _waited(outcome, pending)

        def answer(outcome: dict[str, ErrorCode]) -> None:
            topics = tuple(
                build(
                    mod,
                    "OffsetDeleteResponseTopic",
                    name=topic,
                    partitions=tuple(
                        build(
                            mod,
                            "OffsetDeleteResponsePartition",
                            partition_index=i,
                            error_code=outcome[topic],
                        )
                        for i in indexes
                    ),
                )
                for topic, indexes in asked
            )
            self.link.answer(
                slot,
                build(
                    mod,
                    "OffsetDeleteResponse",
                    error_code=top,
                    throttle_time=_ZERO,
                    topics=topics,
                ),
            )

        self._off_loop(delete, answer, slot)

    # -- helpers -----------------------------------------------------------------------------
    def _off_loop(self, work: Callable[[], Any], then: Callable[[Any], None], slot: Any) -> None:
        """``work()`` on a helper thread, ``then(its result)`` back on the loop."""
        fut = self.listener.run_blocking(work)

        def done() -> None:
            exc = fut.exception()
            if exc is not None:
                raise exc  # (the connection closes: see KafkaConnection.threadsafe)
            then(fut.result())

        fut.add_done_callback(lambda _: self.link.threadsafe(done))


def _waited(
    outcome: dict[str, ErrorCode], pending: list[tuple[str, Future]]
) -> dict[str, ErrorCode]:
    """``outcome`` with each pending key's result once its future is done (a helper thread)."""
    for key, fut in pending:
        failed = fut.exception()
        if failed is None:
            outcome[key] = ErrorCode.none
        elif isinstance(failed, SparkMQError):
            outcome[key] = _group_error(failed)
        else:
            outcome[key] = error_code(failed)
    return outcome
