"""Kafka error codes: one table of (code, name, retriable, description).

Codes, names and retriability follow Kafka's ``Errors`` enum and whether its
exception class derives from ``RetriableException``. Descriptions are ours.
Retriable means the same request may succeed later without the client
changing anything but its metadata or coordinator; non-retriable errors need
a decision (rejoin, reset offsets, fail).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from ingest.errors import BrokerError

__all__ = ["ErrorCode", "ErrorInfo", "error_for", "raise_for_error"]


class ErrorCode(IntEnum):
    """Every Kafka error code; each member also carries ``retriable`` and ``description``."""

    retriable: bool
    description: str

    def __new__(cls, code: int, retriable: bool, description: str) -> ErrorCode:
        member = int.__new__(cls, code)
        member._value_ = code
        member.retriable = retriable
        member.description = description
        return member

    UNKNOWN_SERVER_ERROR = (
        -1,
        False,
        "The broker hit an unexpected error while handling the request.",
    )
    NONE = (0, False, "No error.")
    OFFSET_OUT_OF_RANGE = (
        1,
        False,
        "The offset is outside the range the broker keeps for the partition.",
    )
    CORRUPT_MESSAGE = (
        2,
        True,
        "A message failed its CRC check, is too large, or is otherwise corrupt.",
    )
    UNKNOWN_TOPIC_OR_PARTITION = (3, True, "This broker does not host the topic-partition.")
    INVALID_FETCH_SIZE = (4, False, "The fetch size is invalid.")
    LEADER_NOT_AVAILABLE = (
        5,
        True,
        "The partition has no leader right now (an election is under way).",
    )
    NOT_LEADER_OR_FOLLOWER = (
        6,
        True,
        "This broker is not the leader (or not a replica) of the partition.",
    )
    REQUEST_TIMED_OUT = (7, True, "The request timed out on the broker.")
    BROKER_NOT_AVAILABLE = (8, False, "The broker is not available.")
    REPLICA_NOT_AVAILABLE = (9, True, "The replica is not available for the partition.")
    MESSAGE_TOO_LARGE = (10, False, "A message is larger than the broker accepts.")
    STALE_CONTROLLER_EPOCH = (11, False, "The controller has moved to another broker.")
    OFFSET_METADATA_TOO_LARGE = (
        12,
        False,
        "The metadata string of the offset commit is too large.",
    )
    NETWORK_EXCEPTION = (13, True, "The broker disconnected before answering.")
    COORDINATOR_LOAD_IN_PROGRESS = (14, True, "The coordinator is still loading its state.")
    COORDINATOR_NOT_AVAILABLE = (15, True, "The coordinator is not available.")
    NOT_COORDINATOR = (16, True, "This broker is not the coordinator for the group or transaction.")
    INVALID_TOPIC_EXCEPTION = (17, False, "The topic is invalid for this operation.")
    RECORD_LIST_TOO_LARGE = (18, False, "A record batch is larger than the broker's segment size.")
    NOT_ENOUGH_REPLICAS = (19, True, "Fewer in-sync replicas than required: records were rejected.")
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = (
        20,
        True,
        "Records were written, but to fewer in-sync replicas than required.",
    )
    INVALID_REQUIRED_ACKS = (21, False, "The produce request has an invalid acks value.")
    ILLEGAL_GENERATION = (22, False, "The group generation id is not the current one.")
    INCONSISTENT_GROUP_PROTOCOL = (23, False, "The member's protocols do not match the group's.")
    INVALID_GROUP_ID = (24, False, "The group id is invalid.")
    UNKNOWN_MEMBER_ID = (25, False, "The coordinator does not know this member id.")
    INVALID_SESSION_TIMEOUT = (
        26,
        False,
        "The session timeout is outside the range the broker allows.",
    )
    REBALANCE_IN_PROGRESS = (27, False, "The group is rebalancing; the member must rejoin.")
    INVALID_COMMIT_OFFSET_SIZE = (28, False, "The offset commit data has an invalid size.")
    TOPIC_AUTHORIZATION_FAILED = (29, False, "Not authorized to access the topic.")
    GROUP_AUTHORIZATION_FAILED = (30, False, "Not authorized to access the group.")
    CLUSTER_AUTHORIZATION_FAILED = (31, False, "Not authorized for this cluster operation.")
    INVALID_TIMESTAMP = (32, False, "A message timestamp is outside the accepted range.")
    UNSUPPORTED_SASL_MECHANISM = (33, False, "The broker does not support this SASL mechanism.")
    ILLEGAL_SASL_STATE = (34, False, "The request is not valid in the current SASL state.")
    UNSUPPORTED_VERSION = (35, False, "The broker does not support this API version.")
    TOPIC_ALREADY_EXISTS = (36, False, "A topic with this name already exists.")
    INVALID_PARTITIONS = (37, False, "The partition count is invalid (below 1).")
    INVALID_REPLICATION_FACTOR = (
        38,
        False,
        "The replication factor is below 1 or above the broker count.",
    )
    INVALID_REPLICA_ASSIGNMENT = (39, False, "The replica assignment is invalid.")
    INVALID_CONFIG = (40, False, "The configuration is invalid.")
    NOT_CONTROLLER = (41, True, "This broker is not the active controller.")
    INVALID_REQUEST = (42, False, "The request is malformed or was sent to an incompatible broker.")
    UNSUPPORTED_FOR_MESSAGE_FORMAT = (
        43,
        False,
        "The broker's message format does not support this request.",
    )
    POLICY_VIOLATION = (44, False, "The request violates a configured policy.")
    OUT_OF_ORDER_SEQUENCE_NUMBER = (
        45,
        False,
        "The broker got an out-of-order producer sequence number.",
    )
    DUPLICATE_SEQUENCE_NUMBER = (46, False, "The broker got a duplicate producer sequence number.")
    INVALID_PRODUCER_EPOCH = (47, False, "The producer used an old epoch.")
    INVALID_TXN_STATE = (48, False, "The transactional operation is invalid in the current state.")
    INVALID_PRODUCER_ID_MAPPING = (
        49,
        False,
        "The producer id is not assigned to this transactional id.",
    )
    INVALID_TRANSACTION_TIMEOUT = (
        50,
        False,
        "The transaction timeout exceeds the broker's maximum.",
    )
    CONCURRENT_TRANSACTIONS = (
        51,
        True,
        "Another operation on the same transaction is in progress.",
    )
    TRANSACTION_COORDINATOR_FENCED = (
        52,
        False,
        "The transaction coordinator is no longer current.",
    )
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = (53, False, "Not authorized for the transactional id.")
    SECURITY_DISABLED = (54, False, "Security features are disabled.")
    OPERATION_NOT_ATTEMPTED = (
        55,
        False,
        "The broker skipped this operation (another one in the batch failed).",
    )
    KAFKA_STORAGE_ERROR = (56, True, "The broker had a disk error accessing the log.")
    LOG_DIR_NOT_FOUND = (57, False, "The log directory is not in the broker's configuration.")
    SASL_AUTHENTICATION_FAILED = (58, False, "SASL authentication failed.")
    UNKNOWN_PRODUCER_ID = (59, False, "The broker has no state for this producer id.")
    REASSIGNMENT_IN_PROGRESS = (60, False, "A partition reassignment is in progress.")
    DELEGATION_TOKEN_AUTH_DISABLED = (61, False, "Delegation tokens are not enabled.")
    DELEGATION_TOKEN_NOT_FOUND = (62, False, "The delegation token does not exist.")
    DELEGATION_TOKEN_OWNER_MISMATCH = (
        63,
        False,
        "The principal is not the token's owner or renewer.",
    )
    DELEGATION_TOKEN_REQUEST_NOT_ALLOWED = (
        64,
        False,
        "Delegation token requests are not allowed on this channel.",
    )
    DELEGATION_TOKEN_AUTHORIZATION_FAILED = (65, False, "Not authorized for the delegation token.")
    DELEGATION_TOKEN_EXPIRED = (66, False, "The delegation token has expired.")
    INVALID_PRINCIPAL_TYPE = (67, False, "The principal type is not supported.")
    NON_EMPTY_GROUP = (68, False, "The group still has members.")
    GROUP_ID_NOT_FOUND = (69, False, "The group does not exist.")
    FETCH_SESSION_ID_NOT_FOUND = (70, True, "The broker has no fetch session with this id.")
    INVALID_FETCH_SESSION_EPOCH = (71, True, "The fetch session epoch is not the expected one.")
    LISTENER_NOT_FOUND = (
        72,
        True,
        "The leader has no listener matching the one the metadata came from.",
    )
    TOPIC_DELETION_DISABLED = (73, False, "Topic deletion is disabled.")
    FENCED_LEADER_EPOCH = (74, True, "The request's leader epoch is older than the broker's.")
    UNKNOWN_LEADER_EPOCH = (75, True, "The request's leader epoch is newer than the broker's.")
    UNSUPPORTED_COMPRESSION_TYPE = (
        76,
        False,
        "The client does not support the partition's compression type.",
    )
    STALE_BROKER_EPOCH = (77, False, "The broker epoch has changed.")
    OFFSET_NOT_AVAILABLE = (78, True, "The new leader's high watermark has not caught up yet.")
    MEMBER_ID_REQUIRED = (
        79,
        False,
        "The member must rejoin with the member id the coordinator assigned.",
    )
    PREFERRED_LEADER_NOT_AVAILABLE = (80, True, "The preferred leader is not available.")
    GROUP_MAX_SIZE_REACHED = (81, False, "The group has reached its maximum size.")
    FENCED_INSTANCE_ID = (82, False, "Another member registered with the same group.instance.id.")
    ELIGIBLE_LEADERS_NOT_AVAILABLE = (
        83,
        True,
        "No eligible leader is available for the partition.",
    )
    ELECTION_NOT_NEEDED = (84, True, "No leader election is needed for the partition.")
    NO_REASSIGNMENT_IN_PROGRESS = (85, False, "No partition reassignment is in progress.")
    GROUP_SUBSCRIBED_TO_TOPIC = (
        86,
        False,
        "Cannot delete offsets of a topic the group is subscribed to.",
    )
    INVALID_RECORD = (87, False, "The broker rejected a record that failed validation.")
    UNSTABLE_OFFSET_COMMIT = (88, True, "Pending transactional offsets must settle first.")
    THROTTLING_QUOTA_EXCEEDED = (89, True, "The throttling quota was exceeded.")
    PRODUCER_FENCED = (
        90,
        False,
        "A newer producer with the same transactional id fenced this one.",
    )
    RESOURCE_NOT_FOUND = (91, False, "The request refers to a resource that does not exist.")
    DUPLICATE_RESOURCE = (92, False, "The request refers to the same resource twice.")
    UNACCEPTABLE_CREDENTIAL = (93, False, "The credential does not meet the acceptance criteria.")
    INCONSISTENT_VOTER_SET = (94, False, "The sender or recipient is not an expected voter.")
    INVALID_UPDATE_VERSION = (95, False, "The update version is invalid.")
    FEATURE_UPDATE_FAILED = (96, False, "The finalized features could not be updated.")
    PRINCIPAL_DESERIALIZATION_FAILURE = (
        97,
        False,
        "The broker could not deserialize a forwarded principal.",
    )
    SNAPSHOT_NOT_FOUND = (98, False, "The snapshot does not exist.")
    POSITION_OUT_OF_RANGE = (99, False, "The snapshot position is out of range.")
    UNKNOWN_TOPIC_ID = (100, True, "This broker does not host the topic id.")
    DUPLICATE_BROKER_REGISTRATION = (101, False, "The broker id is already in use.")
    BROKER_ID_NOT_REGISTERED = (102, False, "The broker id is not registered.")
    INCONSISTENT_TOPIC_ID = (103, True, "The topic id does not match the log's topic id.")
    INCONSISTENT_CLUSTER_ID = (104, False, "The cluster id does not match the broker's.")
    TRANSACTIONAL_ID_NOT_FOUND = (105, False, "The transactional id does not exist.")
    FETCH_SESSION_TOPIC_ID_ERROR = (106, True, "The fetch session mixed topic ids inconsistently.")
    INELIGIBLE_REPLICA = (107, False, "The new ISR contains an ineligible replica.")
    NEW_LEADER_ELECTED = (108, False, "The partition state was updated but the leader changed.")
    OFFSET_MOVED_TO_TIERED_STORAGE = (109, False, "The offset has moved to tiered storage.")
    FENCED_MEMBER_EPOCH = (
        110,
        False,
        "The member epoch is fenced; the member must drop its partitions and rejoin.",
    )
    UNRELEASED_INSTANCE_ID = (111, False, "Another member still uses the instance id.")
    UNSUPPORTED_ASSIGNOR = (112, False, "The group does not support the assignor or its version.")
    STALE_MEMBER_EPOCH = (113, False, "The member epoch is stale.")
    MISMATCHED_ENDPOINT_TYPE = (114, False, "The request went to the wrong kind of endpoint.")
    UNSUPPORTED_ENDPOINT_TYPE = (115, False, "The endpoint type is not supported.")
    UNKNOWN_CONTROLLER_ID = (116, False, "The controller id is unknown.")
    UNKNOWN_SUBSCRIPTION_ID = (117, False, "The telemetry subscription id is unknown or outdated.")
    TELEMETRY_TOO_LARGE = (118, False, "The telemetry push is larger than the broker accepts.")
    INVALID_REGISTRATION = (119, False, "The controller considers the broker registration invalid.")
    TRANSACTION_ABORTABLE = (120, False, "The transaction hit an error; abort it to continue.")
    INVALID_RECORD_STATE = (121, False, "The record state is invalid for the acknowledgement.")
    SHARE_SESSION_NOT_FOUND = (122, True, "The share session does not exist.")
    INVALID_SHARE_SESSION_EPOCH = (123, True, "The share session epoch is invalid.")
    FENCED_STATE_EPOCH = (124, False, "The share-group state epoch does not match.")
    INVALID_VOTER_KEY = (125, False, "The voter key does not match the replica's key.")
    DUPLICATE_VOTER = (126, False, "The voter is already in the voter set.")
    VOTER_NOT_FOUND = (127, False, "The voter is not in the voter set.")
    INVALID_REGULAR_EXPRESSION = (128, False, "The regular expression is invalid.")


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    code: int
    name: str
    retriable: bool
    description: str


_BY_CODE: dict[int, ErrorInfo] = {
    member.value: ErrorInfo(member.value, member.name, member.retriable, member.description)
    for member in ErrorCode
}


def error_for(code: int) -> ErrorInfo:
    """The table row of ``code``; unknown codes get a non-retriable row naming the number."""
    info = _BY_CODE.get(code)
    if info is None:
        return ErrorInfo(
            code,
            f"UNKNOWN_ERROR_CODE_{code}",
            False,
            f"Error code {code} is not in this client's table (a newer broker?).",
        )
    return info


def raise_for_error(code: int, *, context: str, message: str | None = None) -> None:
    """Raise ``BrokerError`` when ``code`` is not 0; ``message`` is the broker's own text."""
    if code == 0:
        return
    info = error_for(code)
    raise BrokerError(
        info.code,
        info.name,
        info.retriable,
        context=context,
        message=message or info.description,
    )
