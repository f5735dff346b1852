"""Arrow IPC segments between partition workers and the supervisor.

Workers append decoded records to a ``SegmentWriter`` and report
``SegmentSealed`` and ``CorruptRangeReported``; the supervisor opens the run's
namespace with ``HandoffStore``, reads segments (memory-mapped in shm mode) and
``release``\\ s them once they are durable. See ``store.py`` for layout, modes and
cleanup.
"""

from ingest.handoff.location import HandoffConfig, HandoffLocation
from ingest.handoff.messages import CorruptRangeReported, SegmentSealed
from ingest.handoff.segment import SegmentWriter
from ingest.handoff.store import HandoffError, HandoffStore, read_segment

__all__ = [
    "CorruptRangeReported",
    "HandoffConfig",
    "HandoffError",
    "HandoffLocation",
    "HandoffStore",
    "SegmentSealed",
    "SegmentWriter",
    "read_segment",
]
