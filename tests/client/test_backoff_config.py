"""Pure parts of the client: backoff, configuration and the Secret wrapper."""

from __future__ import annotations

import logging
import pickle

import pytest

from ingest.client import Backoff, ClientConfig, SaslConfig, Secret, TlsConfig
from ingest.client.client_config import parse_address, parse_bootstrap
from ingest.errors import ConfigError


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_backoff_doubles_up_to_the_maximum_without_jitter() -> None:
    clock = FakeClock()
    backoff = Backoff(0.1, 1.0, jitter=0.0, clock=clock, rand=lambda: 0.5)
    delays = [backoff.failed() for _ in range(6)]
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    assert backoff.remaining() == pytest.approx(1.0)
    clock.now += 0.75
    assert backoff.remaining() == pytest.approx(0.25)
    clock.now += 1
    assert backoff.remaining() == 0.0
    backoff.succeeded()
    assert backoff.failures == 0
    assert backoff.failed() == pytest.approx(0.1)


@pytest.mark.parametrize(("draw", "factor"), [(0.0, 0.8), (0.5, 1.0), (0.999999, 1.2)])
def test_backoff_jitter_spans_plus_minus_the_fraction(draw: float, factor: float) -> None:
    backoff = Backoff(0.5, 10.0, jitter=0.2, clock=FakeClock(), rand=lambda: draw)
    assert backoff.delay(3) == pytest.approx(2.0 * factor, rel=1e-5)


def test_backoff_survives_huge_failure_counts() -> None:
    backoff = Backoff(0.1, 5.0, jitter=0.0, clock=FakeClock())
    assert backoff.delay(10_000) == 5.0
    assert backoff.delay(0) == 0.0


@pytest.mark.parametrize(
    "kwargs", [{"initial": 0, "maximum": 1}, {"initial": 2, "maximum": 1}, {"jitter": 1.0}]
)
def test_backoff_rejects_nonsense(kwargs: dict[str, float]) -> None:
    args = {"initial": 0.1, "maximum": 1.0, "jitter": 0.2, **kwargs}
    with pytest.raises(ValueError):
        Backoff(args["initial"], args["maximum"], jitter=args["jitter"])


def test_parse_addresses() -> None:
    assert parse_address("kafka-1:9092") == ("kafka-1", 9092)
    assert parse_address("[::1]:9093") == ("::1", 9093)
    assert parse_bootstrap("a:1, b:2,") == (("a", 1), ("b", 2))
    assert parse_bootstrap(["a:1"]) == (("a", 1),)
    for bad in ("nohost", "h:0", "h:99999", ":9092", "h:x"):
        with pytest.raises(ConfigError) as info:
            parse_address(bad)
        assert info.value.key == "bootstrap_servers"


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"bootstrap_servers": ""}, "bootstrap_servers"),
        ({"request_timeout": 0}, "request_timeout"),
        ({"connect_timeout": -1}, "connect_timeout"),
        ({"max_frame_size": 10}, "max_frame_size"),
        ({"backoff_jitter": 1.5}, "backoff_jitter"),
        ({"retry_timeout": -1}, "retry_timeout"),
    ],
)
def test_bad_config_names_its_key(kwargs: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        ClientConfig(**kwargs)  # type: ignore[arg-type]
    assert info.value.key == key


def test_sasl_config_validates_and_wraps_the_password() -> None:
    config = SaslConfig(mechanism="SCRAM-SHA-512", username="u", password="pw")  # type: ignore[arg-type]
    assert isinstance(config.password, Secret)
    assert config.password.reveal() == "pw"
    with pytest.raises(ConfigError) as info:
        SaslConfig(mechanism="GSSAPI", username="u", password=Secret("x"))  # type: ignore[arg-type]
    assert info.value.key == "sasl.mechanism"
    with pytest.raises(ConfigError):
        SaslConfig(mechanism="PLAIN", username="", password=Secret("x"))
    with pytest.raises(ConfigError):
        TlsConfig(key_file="k.pem")


def test_secrets_never_show_in_repr_str_format_or_logs(caplog: pytest.LogCaptureFixture) -> None:
    password = "correct horse battery staple"
    key_password = "tls-key-passphrase"
    config = ClientConfig(
        bootstrap_servers="b:9092",
        sasl=SaslConfig(mechanism="PLAIN", username="alice", password=Secret(password)),
        tls=TlsConfig(ca_file="ca.pem", key_password=key_password),  # type: ignore[arg-type]
    )
    secret = config.sasl.password if config.sasl else None
    caplog.set_level(logging.DEBUG)
    logging.getLogger("ingest.test").debug("config %s %r %s", config, config, secret)
    rendered = [
        repr(config),
        str(config),
        f"{secret}",
        f"{secret!r}",
        f"{secret:>40}",
        str(config.tls),
        caplog.text,
    ]
    for text in rendered:
        assert password not in text
        assert key_password not in text
    assert "alice" in repr(config)  # the username is not a secret
    assert Secret("a") == Secret("a") and Secret("a") != Secret("b")
    # Configs travel to worker processes: a Secret survives pickling with its value.
    assert pickle.loads(pickle.dumps(config)) == config
