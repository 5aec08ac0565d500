"""Between the wire's shapes (:mod:`spark_mq.protocol`) and the broker's
(:mod:`spark_mq.commands`), for every transport: frames and action bodies become
commands, results become frames and JSON answers. Pure functions, no I/O."""

from __future__ import annotations

from typing import Any

from spark_mq import commands as c
from spark_mq import protocol
from spark_mq.errors import ProtocolError


def settle_of(frame: protocol.Settle) -> c.Settle:
    # (a parsed frame's entries are a tuple already: tuple() hands the same one back)
    return c.Settle(frame.verb, frame.request_id, tuple(frame.entries))


def reply_frame(reply: c.SettleReply) -> protocol.Reply:
    refused = tuple(
        {"offset": r.offset, "reason": r.reason, "again": True}
        if r.comes_again  # (not settled, delivered again: see Refused)
        else {"offset": r.offset, "reason": r.reason}
        for r in reply.refused
    )
    return protocol.Reply(reply.request_id, refused)


def attach_of(frame: protocol.Consume) -> c.Attach:
    return c.Attach(
        frame.destination,
        frame.subscription,
        frame.prefetch,
        frame.selector,
        frame.durable,
        frame.temporary,
    )


def ticket_command(frame: protocol.Frame) -> c.Browse | c.ClaimedRows:
    """A ``DoGet`` ticket's command: a browse, or the messages of a claim."""
    match frame:
        case protocol.Browse():
            return c.Browse(frame.destination, frame.subscription, frame.limit, frame.selector)
        case protocol.Claimed():
            return c.ClaimedRows(
                frame.destination, frame.subscription, frame.consumer, frame.number
            )
    raise ProtocolError("do_get expects a browse or claimed command", fault="remote")


def action_command(name: str, body: bytes) -> c.Command:
    """An admin action (its type and body) as the command it asks for; anything malformed is
    a ``ProtocolError`` naming the action and what is wrong."""
    if name == "commit_transaction":  # binary body: acks, then Arrow IPC
        acks, messages = protocol.decode_commit(body)
        return c.CommitTransaction(tuple(acks), messages)
    args = protocol.ActionArgs(name, protocol.parse_action_body(body))
    match name:
        case "ping":
            return c.Ping()
        case "reload_security":
            return c.ReloadSecurity()
        case "promote":
            return c.HandOver()
        case "pin_destination":
            return c.PinDestination(args.text("name"), args.optional_text("member"))
        case "broker_status":
            return c.BrokerStatus()
        case "show_config":
            return c.ShowConfig()
        case "move":
            limit = args.optional_integer("limit")
            return c.Move(
                args.text("source"),
                args.optional_text("target"),
                args.optional_text("subscription"),
                1000 if limit is None else limit,
                args.optional_text("selector"),
            )
        case "create_destination":
            kind = args.text("kind")
            if kind not in ("queue", "topic"):
                raise ProtocolError(
                    f"action 'create_destination': kind must be 'queue' or 'topic', got {kind!r}",
                    fault="remote",
                )
            return c.CreateDestination(
                args.text("name"),
                kind,  # type: ignore[arg-type]
                args.optional_mapping("settings"),
            )
        case "configure_destination":
            return c.ConfigureDestination(args.text("name"), args.mapping("settings"))
        case "add_partitions":
            return c.AddPartitions(args.text("name"), args.integer("partitions"))
        case "delete_destination":
            return c.DeleteDestination(args.text("name"))
        case "list_destinations":
            return c.ListDestinations()
        case "create_subscription":
            return c.CreateSubscription(
                args.text("destination"), args.text("name"), args.optional_text("selector")
            )
        case "delete_subscription":
            return c.DeleteSubscription(args.text("destination"), args.text("name"))
        case "purge":
            return c.Purge(args.text("name"), args.optional_text("subscription"))
        case "stats":
            return c.Stats(args.text("name"))
        case "partitions":
            return c.Partitions(args.text("name"), args.optional_text("use") or "produce")
        case "claim":
            return c.Claim(
                args.text("destination"),
                args.optional_text("subscription"),
                args.text("consumer"),
                args.integer("number"),
                args.integer("limit"),
                args.optional_integer("below"),
            )
        case "ack_claims":
            return c.AckClaims(
                args.text("destination"),
                args.optional_text("subscription"),
                args.text("consumer"),
                args.integer("upto"),
            )
        case "release_claims":
            return c.ReleaseClaims(
                args.text("destination"), args.optional_text("subscription"), args.text("consumer")
            )
    raise ProtocolError(
        f"unknown action {name!r}; the actions are {', '.join(protocol.ADMIN_ACTIONS)}",
        fault="remote",
    )


def action_answer(cmd: c.Command, result: Any) -> Any:
    """What an admin action answers (JSON), from what the session returned."""
    match cmd:
        case c.CreateDestination() | c.CreateSubscription():
            return {"created": result}
        case c.DeleteDestination() | c.DeleteSubscription():
            return {"deleted": True}
        case c.Purge():
            return {"purged": result}
        case c.Claim():
            return {"count": len(result)}
        case c.AckClaims():
            return {"acked": result}
        case c.ReleaseClaims():
            return {"released": result}
        case c.CommitTransaction():
            return {"offsets": result}
        case c.ReloadSecurity():
            reloaded, what = result
            return {"reloaded": reloaded, "detail": what}
    return result  # configure (the settings), list, stats
