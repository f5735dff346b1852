"""The supervisor's engine: partition workers, Spark batches, Delta commits, then Kafka commits.

``Engine`` is what ``ingest run`` and ``ingest replay`` share: one worker
process per partition fetching into Arrow segments (``pool.WorkerPool``), a main
loop that collects their sealed segments, starts a Spark batch when the
``[trigger]`` bounds are reached (``batcher.Batcher``: one batch at a time, on
its own thread, so the loop keeps reading workers and the group meanwhile),
releases the segments once the batch is durable in Delta, restarts crashed
workers, and stops gracefully. Each partition's lifecycle is a table
(``partitions.LIFECYCLE``); every config conversion is in ``ingest.supervisor.wiring``.

Where partitions come from is the engine's ``Source``, plugged in, not subclassed:
``ingest.supervisor.modes.group_run.GroupSource`` (``ingest run``) or
``ingest.supervisor.modes.replay.ReplaySource``.

The group source adds the consumer group: partitions come and go
with rebalances, a worker starts at max(committed offset, txn version + 1)
(invariant 3), and after each durable batch the owned partitions' offsets
are committed at txn version + 1 with the table version as metadata
(invariant 1). Nothing is committed for a partition no longer owned
(invariant 4): lost partitions are dropped at once and a batch result is
only committed for the partition incarnation that was owned when the batch
started. Revoked partitions wait for the in-flight batch that holds them,
are committed, then acknowledged (an OffsetCommit is sent without waiting: its
answer comes with the group's events, so the loop never stalls on the coordinator,
and revocations wait for it); their segments not yet in a batch are
abandoned (the next owner fetches them again, and the txn filter makes any
overlap harmless).

Main loop, one iteration (at most ~50 ms when idle)::

    group events -> assignments, revocations, losses
    worker events -> pending segments, finished/crashed workers (restart with backoff)
    batch done?   -> durable offsets, commit, release segments
    trigger?      -> next batch (bytes / records / age / draining / buffer cap)
    maintenance?       -> every maintenance.interval, no batch running: a pass on its thread
    stop?         -> workers seal and stop, the final batch, commit, leave
"""
