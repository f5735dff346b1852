"""The sans-I/O SASL mechanisms against the RFC test vectors and malformed servers."""

from __future__ import annotations

import base64

import pytest

from ingest.client import SaslConfig, Secret
from ingest.client.scram import PlainMechanism, ScramClient, mechanism_for
from ingest.errors import BrokerError


def test_rfc5802_sha1_example() -> None:
    # RFC 5802 section 5: the algorithm with SHA-1, user "user", password "pencil".
    client = ScramClient(
        "user", Secret("pencil"), mechanism="SCRAM-SHA-1", nonce="fyko+d2lbbFgONRv9qkxdawL"
    )
    assert client.start() == b"n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL"
    final = client.step(b"r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096")
    assert final == (
        b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts="
    )
    assert not client.complete
    assert client.step(b"v=rmF9pqV8S7suAoZWja4dJRkFsKQ=") is None
    assert client.complete


def test_rfc7677_sha256_example() -> None:
    client = ScramClient(
        "user", Secret("pencil"), mechanism="SCRAM-SHA-256", nonce="rOprNGfwEbeRWgbNEkqO"
    )
    assert client.start() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    final = client.step(
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    assert final == (
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    assert client.step(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=") is None
    assert client.complete


def test_usernames_are_escaped() -> None:
    client = ScramClient("a=b,c", Secret("p"), nonce="N")
    assert client.start() == b"n,,n=a=3Db=2Cc,r=N"


def test_a_random_nonce_differs_per_exchange() -> None:
    first = ScramClient("u", Secret("p")).start()
    second = ScramClient("u", Secret("p")).start()
    assert first != second and b"," not in first.split(b"r=")[1]


SERVER_FIRST = b"r=NONCEserver,s=" + base64.b64encode(b"salt") + b",i=4096"


@pytest.mark.parametrize(
    ("server_first", "reason"),
    [
        (b"r=OTHERserver,s=c2FsdA==,i=4096", "nonce does not extend ours"),
        (b"r=NONCE,s=c2FsdA==,i=4096", "nonce does not extend ours"),
        (b"r=NONCEserver,s=c2FsdA==,i=1024", "below the minimum 4096"),
        (b"r=NONCEserver,s=c2FsdA==,i=2147483647", "above the maximum 16384"),
        (b"r=NONCEserver,s=c2FsdA==,i=1" + b"0" * 30, "above the maximum 16384"),
        (b"r=NONCEserver,i=4096", "salt or iteration count"),
        (b"r=NONCEserver,s=!!!,i=4096", "salt or iteration count"),
        (b"m=ext,r=NONCEserver,s=c2FsdA==,i=4096", "extension"),
        (b"e=unknown-user", "unknown-user"),
        (b"garbage", "malformed"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_bad_server_first_messages_fail_cleanly(server_first: bytes, reason: str) -> None:
    client = ScramClient("u", Secret("hunter2"), nonce="NONCE", context="broker b:1 (node 1)")
    client.start()
    with pytest.raises(BrokerError) as info:
        client.step(server_first)
    error = info.value
    assert error.name == "SASL_AUTHENTICATION_FAILED" and not error.retriable
    assert reason in str(error) and "broker b:1 (node 1)" in str(error)
    assert "hunter2" not in str(error) and "hunter2" not in repr(error)
    with pytest.raises(BrokerError):
        client.step(b"v=AAAA")  # a failed exchange stays failed


@pytest.mark.parametrize(
    ("server_final", "reason"),
    [
        (b"v=" + base64.b64encode(b"x" * 32), "signature does not match"),
        (b"e=invalid-proof", "rejected our proof: invalid-proof"),
        (b"x=1", "no valid verifier"),
    ],
)
def test_bad_server_final_messages_fail(server_final: bytes, reason: str) -> None:
    client = ScramClient("u", Secret("hunter2"), nonce="NONCE")
    client.start()
    client.step(SERVER_FIRST)
    with pytest.raises(BrokerError, match=reason):
        client.step(server_final)
    assert not client.complete


def test_plain_sends_one_message() -> None:
    plain = PlainMechanism("alice", Secret("pw"))
    assert plain.start() == b"\x00alice\x00pw"
    assert not plain.complete
    assert plain.step(b"") is None
    assert plain.complete
    assert "pw" not in repr(plain)


def test_mechanism_for_config() -> None:
    scram = mechanism_for(SaslConfig(mechanism="SCRAM-SHA-512", username="u", password=Secret("p")))
    assert isinstance(scram, ScramClient) and scram.name == "SCRAM-SHA-512"
    plain = mechanism_for(SaslConfig(mechanism="PLAIN", username="u", password=Secret("p")))
    assert isinstance(plain, PlainMechanism)
