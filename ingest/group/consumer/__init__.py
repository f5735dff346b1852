"""The consumer group protocol of KIP-848 (ConsumerGroupHeartbeat): its tables
(``consumer_transitions.py``), settings (``consumer_config.py``), its own inputs and
outputs (``consumer_events.py``), heartbeats (``consumer_requests.py``), the member's
record (``consumer_member.py``) and its one machine, ``ConsumerMachine``
(``consumer_machine.py``).

It imports the group's root modules (the engine, events, in-flight requests, commits),
``ingest.protocol`` and ``ingest.errors``; never ``group/classic``.
"""
