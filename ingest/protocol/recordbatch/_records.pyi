"""Types of the C records kernel (_records.c)."""

from typing import Any

from typing_extensions import Buffer

ENTRY_SIZE: int
HARDWARE_CRC: int

class OwnedBuffer:
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...

# (complete, valid, attributes_or, min_valid_last_offset, max_last_offset, tail_status)
ScanSummary = tuple[int, int, int, int | None, int | None, int]

def scan(buf: Buffer, check_crc: bool, /) -> tuple[bytes, ScanSummary]: ...
def decode(
    buf: Buffer,
    table: Buffer,
    indices: Buffer | None,
    payloads: list[Any] | None,
    min_offset: int,
    partition: int,
    /,
) -> dict[str, Any]: ...
def crc32c(data: Buffer, crc: int = 0, hardware: bool = True, /) -> int: ...
def set_buffer_cache(limit_bytes: int, /) -> int: ...
def utf8_valid(data: Buffer, /) -> bool: ...
