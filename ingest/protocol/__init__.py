"""Sans-I/O Kafka wire-protocol codec.

Layers, bottom up: ``primitives`` (Reader and writers), ``schema`` (the
declarative field specs and the one encode/decode engine), ``headers``,
``messages`` (one frozen dataclass per Kafka message and nested struct),
``codec`` (whole frames), plus ``consumer`` (consumer-group protocol
payloads) and ``error_codes``. No sockets, threads or clocks here.
"""
