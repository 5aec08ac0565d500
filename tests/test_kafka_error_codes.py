"""The Kafka error codes sparkmq's errors are told as (spark_mq.transports.kafka.link), which
decide what a Kafka client does next: ask again, abort, or stop."""

from __future__ import annotations

import pytest

from spark_mq.connection.forwarding import _as_forwarded
from spark_mq.errors import (
    BrokerUnavailable,
    ConfigError,
    DestinationNotFound,
    DiskFull,
    NotAuthenticated,
    NotAuthorized,
    NotOwner,
    SparkMQError,
)
from spark_mq.transports.kafka.codec import ErrorCode
from spark_mq.transports.kafka.link import error_code


@pytest.mark.parametrize("refusal", [NotAuthorized("no rule"), NotAuthenticated("who?")])
def test_a_member_s_forwarding_refused_by_the_owner_is_a_cluster_authorization_failure(
    refusal: SparkMQError,
) -> None:
    """The client's own rights were checked where it connected: the owner refusing the
    forwarding member is the operator's to mend, told as CLUSTER_AUTHORIZATION_FAILED (not as
    the client's topic authorization, nor an unknown server error)."""
    owner = NotOwner("served elsewhere", member="a", destination="orders")
    told = _as_forwarded(refusal, owner)
    assert isinstance(told, ConfigError) and "forwarding identity" in told.message
    assert error_code(told) is ErrorCode.cluster_authorization_failed


def test_other_errors_keep_their_codes() -> None:
    owner = NotOwner("served elsewhere", member="a", destination="orders")
    unavailable = BrokerUnavailable("being placed")
    assert _as_forwarded(unavailable, owner) is unavailable
    assert error_code(NotAuthorized("no rule")) is ErrorCode.topic_authorization_failed
    assert error_code(ConfigError("bad setting")) is ErrorCode.unknown_server_error
    assert error_code(DestinationNotFound("gone")) is ErrorCode.unknown_topic_or_partition
    assert error_code(DiskFull("full")) is ErrorCode.kafka_storage_error
