"""The classic group protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup): its tables
(``classic_transitions.py``), settings (``classic_config.py``), requests
(``classic_requests.py``), the leader's assignment (``leader.py``), the member's record
(``classic_member.py``) and its one machine, ``GroupMachine`` (``classic_machine.py``).

It imports the group's root modules (the engine, events, in-flight requests, commits),
``ingest.protocol`` and ``ingest.errors``; never ``group/consumer``.
"""
