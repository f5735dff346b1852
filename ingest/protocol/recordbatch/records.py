"""Kafka RecordBatch v2 to Arrow: the fast, vectorised decoder of Fetch ``records``.

``decode_records`` turns one partition's ``records`` bytes from a Fetch
response into ONE ``pyarrow.RecordBatch`` with the schema ``RECORD_SCHEMA``,
plus where the next Fetch should start and a report of every corrupt batch.

How (no Python object per record):

1. ``_records.scan`` (C) walks the batch framing once and returns a table of
   batch headers (one 80-byte row per batch, read here as a numpy structured
   array), checking CRC32C on the way.
2. numpy picks the batches to decode: valid, not control, not wholly below
   ``fetch_offset``; for ``read_committed``, a short per-batch loop applies
   Kafka's aborted-transaction algorithm. Compressed batches are decompressed
   one by one (``compression.py``, bounded).
3. ``_records.decode`` (C) parses every record of the chosen batches in one
   pass and fills Arrow buffers for all of them at once (offsets, timestamps,
   key and value offsets, data and validity, header list and struct children).
   A batch whose records turn out malformed is rolled back and reported.
4. ``pa.Array.from_buffers`` wraps those buffers without a copy.

Choices:

* ``topic`` is ``dictionary<int32, string>``: one dictionary entry, all-zero
  indices, so the column costs 4 bytes a row instead of the name.
* Magic v0/v1 message sets are not decoded: each is reported as a corrupt
  range "unsupported magic v0/v1 at offset N" (Fetch v4+ from a Kafka 0.11+
  broker only returns them for topics still stored in the old format).
* Framing: a batch whose length field is intact but whose content is bad is
  reported and decoding goes on with the next batch. A length below the
  smallest legal message (14), or a truncated batch with an impossible magic,
  breaks the framing: the rest of the buffer is one corrupt range. A trailing
  batch cut short (Fetch max_bytes) is not an error: its declared size goes to
  ``incomplete_batch_size``. A tail shorter than the 12-byte framing is
  ignored, as the Java client does.
* ``next_offset`` is the highest last offset of any batch with intact framing
  plus one: decoded, control, aborted and corrupt batches all count, so a
  consumer never refetches them. A corrupt batch's last offset comes from its
  unverified header; when the header cannot give it (unknown magic, too short)
  the next batch's base offset - 1 does, so no skipped offset goes unreported.
  ``None`` when no batch was complete.
* Record checks follow the Java client (record length must match its fields,
  no bytes after the last record, varints at most 5/10 bytes, any negative
  key/value length means null) plus one more: offset deltas must increase and
  stay within the batch's last offset delta, which keeps offsets unique.
* Header keys that are not valid UTF-8 are decoded with U+FFFD replacement,
  like Java's ``new String(bytes, UTF_8)``; a rare, per-header Python path.
* Output memory: the kernel keeps Arrow buffers that pyarrow has freed (up to
  64 MiB, ``_records.set_buffer_cache``) for the next call, since faulting in
  fresh pages cost 2-3x the decoding itself.
* Decompression is capped per batch (``max_batch_bytes``, default 64 MiB);
  a batch past it is reported corrupt. One call's decoded data must stay
  below 2 GiB (Arrow binary offsets are int32); past that it raises DecodeError.

CRC32C (``check_crc``, default **False**): the kernel checks each batch's CRC32C
with SSE4.2 ``crc32`` over three interleaved lanes when the CPU has it (runtime
check; about 28 GB/s on the 2-core AMD EPYC test machine), else slice-by-8.
Measured with ``.venv/bin/python scripts/bench/decode.py`` (1 MiB fetch
buffers of ~1 MB batches, decode alone, one core, best of 7)::

    records, codec      CRC off          CRC on           cost of CRC
    100 B, none         49.2 M rec/s     32.8 M rec/s     +50%
    1 KB,  none          9.1 M rec/s      6.5 M rec/s     +40%
    100 B, lz4          17.8 M rec/s     16.8 M rec/s      +6%
    1 KB,  lz4           2.6 M rec/s      2.6 M rec/s      ~0%
    100 B, zstd          8.2 M rec/s      8.1 M rec/s      +1%
    1 KB,  zstd          1.3 M rec/s      1.3 M rec/s      +1%

Uncompressed decoding runs at 6-9 GB/s, so even a CRC at memory speed costs
40-50% there, far above the 10% allowed for a default: checks are off by
default. Brokers verify CRCs when they accept a batch and TCP/TLS guard the
wire; pass ``check_crc=True`` to guard against storage corruption as well (it
is nearly free on compressed topics).

The rooms: this module drives the decode (scan, batch selection, the
read_committed walk, the kernel's decode); ``records_arrow.py`` holds
``RECORD_SCHEMA`` and wraps the kernel's buffers; ``records_corrupt.py`` turns
rejected batches into ``CorruptBatch`` reports; ``records_format.py`` holds the
wire layout's constants and ``control_marker``. Their public names are
importable from here as well.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ingest.errors import DecodeError
from ingest.protocol.recordbatch.compression import decompress
from ingest.protocol.recordbatch.records_arrow import (
    HEADER_TYPE,
    OFFSET_COLUMN,
    RECORD_SCHEMA,
    TIMESTAMP_COLUMN,
    batch_from_kernel,
    int64_values,
)
from ingest.protocol.recordbatch.records_corrupt import (
    BatchStatus,
    CorruptBatch,
    CorruptKind,
    RecordError,
    bound_skipped_batches,
    corrupt_from_entry,
    record_error_reason,
    scan_corrupt,
    status_reason,
)
from ingest.protocol.recordbatch.records_format import (
    ATTR_CODEC_MASK,
    ATTR_CONTROL,
    ATTR_LOG_APPEND_TIME,
    ATTR_TRANSACTIONAL,
    CONTROL_ABORT,
    CONTROL_COMMIT,
    V2_HEADER_SIZE,
    control_marker,
)
from ingest.protocol.recordbatch.transactions import CommittedWalk, UnlistedAbort

try:
    from ingest.protocol.recordbatch import _records
except ImportError as exc:  # pragma: no cover - only without a build
    raise ImportError(
        "ingest.protocol.recordbatch._records (the C records kernel) is not built; "
        "run `pip install -e .` in the repository"
    ) from exc

# The decoder's names, and those of records_arrow.py, records_format.py and
# records_corrupt.py that the worker, the handoff, records_reference.py and tests import.
__all__ = [
    "ATTR_CODEC_MASK",
    "ATTR_CONTROL",
    "ATTR_LOG_APPEND_TIME",
    "ATTR_TRANSACTIONAL",
    "CONTROL_ABORT",
    "CONTROL_COMMIT",
    "DEFAULT_MAX_BATCH_BYTES",
    "HEADER_TYPE",
    "OFFSET_COLUMN",
    "RECORD_SCHEMA",
    "TIMESTAMP_COLUMN",
    "BatchStatus",
    "CorruptBatch",
    "CorruptKind",
    "DecodedRecords",
    "RecordError",
    "batch_epochs",
    "bound_skipped_batches",
    "control_marker",
    "crc32c",
    "decode_records",
    "int64_values",
    "record_error_reason",
    "status_reason",
]

DEFAULT_MAX_BATCH_BYTES = 64 * 1024 * 1024

# Layout of the batch-header table written by _records.scan (entry_t in _records.c).
_ENTRY_DTYPE = np.dtype(
    [
        ("start", "=i8"),
        ("size", "=i8"),
        ("base_offset", "=i8"),
        ("last_offset", "=i8"),
        ("base_timestamp", "=i8"),
        ("max_timestamp", "=i8"),
        ("producer_id", "=i8"),
        ("length", "=i4"),
        ("record_count", "=i4"),
        ("crc_stored", "=u4"),
        ("crc_computed", "=u4"),
        ("attributes", "=i2"),
        ("magic", "i1"),
        ("status", "u1"),
        ("has_last_offset", "u1"),
        ("pad", "V3"),
    ]
)
if _ENTRY_DTYPE.itemsize != _records.ENTRY_SIZE:  # pragma: no cover - a build mismatch
    raise ImportError("ingest.protocol.recordbatch._records does not match records.py; rebuild it")

_INT64_MIN = -(2**63)
# BatchStatus values as plain ints: enum attribute access is slow on the per-call path.
_OK = 0
_BROKEN_FRAMING = 8
_INCOMPLETE = 9
_NO_TAIL = -1  # the answer ends on a batch boundary (the scan's tail when none)


@dataclass(frozen=True)
class DecodedRecords:
    """One partition's Fetch records, decoded."""

    batch: pa.RecordBatch
    next_offset: int | None
    incomplete_batch_size: int | None
    corrupt: tuple[CorruptBatch, ...]
    # read_committed only (transactions.py): aborted records the broker failed to list,
    # dropped here; those handed on by an earlier answer (a fatal broker fault); and the
    # producers whose kept data has no marker yet, for the next answer's ``carried``.
    unlisted_aborts: tuple[UnlistedAbort, ...] = ()
    carried_aborts: tuple[UnlistedAbort, ...] = ()
    open_transactions: tuple[tuple[int, int], ...] = ()
    # (base offset, partition leader epoch) of each valid batch whose epoch differs from
    # the batch before it (KIP-101): the epoch of any offset read is the last at or below it.
    epochs: tuple[tuple[int, int], ...] = ()


def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """CRC32C (Castagnoli) of data, continuing from ``crc``."""
    return _records.crc32c(data, crc)


def _as_view(records: bytes | bytearray | memoryview | pa.Buffer) -> memoryview:
    view = memoryview(records)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def _batch_records(view: memoryview, entry: Any) -> memoryview:
    start = int(entry["start"])
    return view[start + V2_HEADER_SIZE : start + int(entry["size"])]


def decode_records(
    records: bytes | bytearray | memoryview | pa.Buffer,
    *,
    topic: str,
    partition: int,
    read_committed: bool = False,
    aborted_transactions: Sequence[tuple[int, int]] | None = None,  # (producer_id, first_offset)
    fetch_offset: int | None = None,
    check_crc: bool = False,
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
    carried: Mapping[int, int] | None = None,
    max_decode_bytes: int | None = None,
) -> DecodedRecords:
    """Decodes one partition's Fetch ``records`` into one Arrow RecordBatch.

    Records below ``fetch_offset`` are dropped (Kafka returns whole batches).
    With ``read_committed``, control batches are always skipped and records of
    aborted transactions (per ``aborted_transactions`` from the same Fetch
    response, and per ABORT markers the broker failed to list) are dropped;
    ``carried`` is the previous answer's ``open_transactions``. Corrupt batches are reported in ``corrupt``, never
    raised; DecodeError is raised only when one call's output would pass 2 GiB.

    ``max_decode_bytes`` bounds what one call decompresses, whatever the compression ratio:
    batches are taken in order while their records' sizes (decompressed) fit in it, the
    first always; the answer then ends before the first batch left out, as if the broker
    had sent no more (``next_offset`` is that batch's base offset: the next Fetch starts
    there).
    """
    view = _as_view(records)
    table, summary = _records.scan(view, check_crc)
    complete, valid_count, attributes_or, min_valid_last, max_last, tail = summary
    corrupt: list[tuple[int, CorruptBatch]] = []
    entries: Any = None

    def entry_table() -> Any:
        nonlocal entries
        if entries is None:
            entries = np.frombuffer(table, dtype=_ENTRY_DTYPE)
        return entries

    cache: dict[int, Any] = {}  # records decompressed by the budget, by table index
    cut: int | None = None
    if max_decode_bytes is not None and attributes_or & ATTR_CODEC_MASK and complete:
        cut = _budget(
            view, entry_table()[:complete], fetch_offset, max_decode_bytes, max_batch_bytes, cache
        )
    if cut is not None:  # the answer ends before batch ``cut``, as if no more were sent
        complete, tail = cut, _NO_TAIL

    incomplete_batch_size: int | None = None
    if tail == _INCOMPLETE:
        incomplete_batch_size = int(entry_table()["size"][complete])
    elif tail == _BROKEN_FRAMING:
        corrupt.append((complete, scan_corrupt(view, entry_table()[complete])))

    next_offset: int | None = None
    if cut is not None:
        max_last = int(entry_table()["base_offset"][cut]) - 1
    if max_last is not None:
        next_offset = max_last + 1
        if fetch_offset is not None:
            next_offset = max(next_offset, fetch_offset)

    # The common case needs no per-batch decision: every batch valid, uncompressed, not
    # control, none wholly below fetch_offset, nothing that could be aborted.
    simple = (
        cut is None
        and valid_count == complete
        and not attributes_or & (ATTR_CONTROL | ATTR_CODEC_MASK)
        and (fetch_offset is None or min_valid_last is None or fetch_offset <= min_valid_last)
        and not (read_committed and attributes_or & ATTR_TRANSACTIONAL)
    )
    indices: Any = None
    payloads: list[Any] | None = None
    walk = CommittedWalk(aborted_transactions, fetch_offset, carried) if read_committed else None
    if not simple:
        indices, payloads = _select(
            view, entry_table()[:complete], walk, fetch_offset, max_batch_bytes, corrupt, cache
        )

    min_offset = _INT64_MIN if fetch_offset is None else fetch_offset
    try:
        out = _records.decode(view, table, indices, payloads, min_offset, partition)
    except OverflowError as exc:
        raise DecodeError(str(exc), field="records") from None

    for index, error, record in out["failures"]:
        entry = entry_table()[index]
        reason = record_error_reason(error, record, int(entry["record_count"]))
        corrupt.append((index, corrupt_from_entry(view, entry, reason, "structure")))

    if len(corrupt) > 1:
        corrupt.sort(key=lambda item: item[0])
    epochs = batch_epochs(view, entry_table()[:complete]) if complete else ()
    return DecodedRecords(
        batch=batch_from_kernel(out, topic),
        next_offset=next_offset,
        incomplete_batch_size=incomplete_batch_size,
        corrupt=bound_skipped_batches(view, [batch for _, batch in corrupt]),
        unlisted_aborts=tuple(walk.unlisted) if walk is not None else (),
        carried_aborts=tuple(walk.carried_aborts) if walk is not None else (),
        open_transactions=walk.open_transactions() if walk is not None else (),
        epochs=epochs,
    )


# partition_leader_epoch: int32 after base_offset (int64) and batch_length (int32).
_EPOCH_AT = 12


def batch_epochs(view: memoryview, entries: Any) -> tuple[tuple[int, int], ...]:
    """(base offset, partition leader epoch) where the epoch changes, over the valid
    batches of a scan's ``entries``; the first valid batch always starts a run."""
    valid = entries[entries["status"] == _OK]
    if not len(valid):
        return ()
    raw = np.frombuffer(view, dtype=np.uint8)
    at = valid["start"].astype(np.int64) + _EPOCH_AT
    epochs = (
        (raw[at].astype(np.int64) << 24)
        | (raw[at + 1].astype(np.int64) << 16)
        | (raw[at + 2].astype(np.int64) << 8)
        | raw[at + 3].astype(np.int64)
    )
    epochs = np.where(epochs >= 2**31, epochs - 2**32, epochs)
    change = np.ones(len(epochs), dtype=bool)
    change[1:] = epochs[1:] != epochs[:-1]
    bases = valid["base_offset"][change]
    return tuple((int(b), int(e)) for b, e in zip(bases, epochs[change], strict=True))


def _select(
    view: memoryview,
    entries: Any,
    walk: CommittedWalk | None,
    fetch_offset: int | None,
    max_batch_bytes: int,
    corrupt: list[tuple[int, CorruptBatch]],
    cache: dict[int, Any] | None = None,
) -> tuple[Any, list[Any]]:
    """The batches to decode (table indices) and their decompressed records (those in
    ``cache`` by index were decompressed already).

    Reports the batches the scan rejected, and those that fail to decompress.
    """
    status = entries["status"]
    for bad in np.flatnonzero(status != _OK):
        corrupt.append((int(bad), scan_corrupt(view, entries[bad])))
    attributes = entries["attributes"]
    valid = status == _OK
    control = (attributes & ATTR_CONTROL) != 0
    wanted = valid & ~control
    if fetch_offset is not None:
        wanted &= entries["last_offset"] >= fetch_offset
    if walk is not None:
        _drop_aborted(view, entries, valid, control, wanted, walk, max_batch_bytes, corrupt)

    indices = np.flatnonzero(wanted).astype(np.int64)
    payloads: list[Any] = [None] * len(indices)
    codecs = attributes[indices] & ATTR_CODEC_MASK
    failed: list[int] = []
    for position in np.flatnonzero(codecs != 0):
        index = int(indices[position])
        entry = entries[index]
        try:
            cached = cache.pop(index, None) if cache else None
            payloads[position] = (
                cached
                if cached is not None
                else decompress(
                    int(codecs[position]), _batch_records(view, entry), max_size=max_batch_bytes
                )
            )
        except DecodeError as exc:
            reason = f"decompression failed: {exc.reason}"
            corrupt.append((index, corrupt_from_entry(view, entry, reason, "decompression")))
            failed.append(int(position))
    if failed:
        keep = np.ones(len(indices), dtype=bool)
        keep[failed] = False
        payloads = [payload for payload, kept in zip(payloads, keep, strict=True) if kept]
        indices = indices[keep]
    return indices, payloads


def _budget(
    view: memoryview,
    entries: Any,
    fetch_offset: int | None,
    max_decode_bytes: int,
    max_batch_bytes: int,
    cache: dict[int, Any],
) -> int | None:
    """Where the batches a decode may take end: the index of the first data batch whose
    records would pass ``max_decode_bytes`` (None: all fit). The first data batch is
    always taken. Decompressed records land in ``cache`` by index; one that fails to
    decompress counts as nothing here (``_select`` reports it)."""
    attributes = entries["attributes"]
    data = (entries["status"] == _OK) & ((attributes & ATTR_CONTROL) == 0)
    if fetch_offset is not None:
        data &= entries["last_offset"] >= fetch_offset
    spent = 0
    taken = False
    for index in np.flatnonzero(data):
        entry = entries[index]
        codec = int(attributes[index]) & ATTR_CODEC_MASK
        size = int(entry["size"])
        if codec:
            try:
                payload = decompress(codec, _batch_records(view, entry), max_size=max_batch_bytes)
            except DecodeError:
                continue
            size = len(payload)
        if taken and spent + size > max_decode_bytes:
            return int(index)
        if codec:
            cache[int(index)] = payload
        spent += size
        taken = True
    return None


def _drop_aborted(
    view: memoryview,
    entries: Any,
    valid: Any,
    control: Any,
    wanted: Any,
    walk: CommittedWalk,
    max_batch_bytes: int,
    corrupt: list[tuple[int, CorruptBatch]],
) -> None:
    """The read_committed walk (``transactions.CommittedWalk``), in place on ``wanted``."""
    producer_ids = entries["producer_id"]
    candidates = valid & (producer_ids >= 0)
    # Java consumes pending aborts up to each batch's last offset, batch by batch; only
    # the running maximum matters, so batches that cannot change anything are skipped.
    reach = np.maximum.accumulate(np.where(candidates, entries["last_offset"], _INT64_MIN))
    candidates &= control | ((entries["attributes"] & ATTR_TRANSACTIONAL) != 0)
    for index in np.flatnonzero(candidates):
        entry = entries[index]
        walk.reach(int(reach[index]))
        producer_id = int(producer_ids[index])
        if control[index]:
            try:
                payload = decompress(
                    int(entry["attributes"]) & ATTR_CODEC_MASK,
                    _batch_records(view, entry),
                    max_size=max_batch_bytes,
                )
                marker = control_marker(payload)
            except DecodeError as exc:
                reason = f"bad control record: {exc.reason}"
                corrupt.append((int(index), corrupt_from_entry(view, entry, reason, "control")))
                continue
            if marker is not None:
                for aborted in walk.marker(producer_id, int(entry["base_offset"]), marker):
                    wanted[aborted] = False
        elif wanted[index]:
            last = int(entry["last_offset"])
            wanted[index] = walk.data(int(index), producer_id, int(entry["base_offset"]), last)
