"""Hashing in chunks, line-aligned splits and the split reader: exact lines, bounded memory."""

from __future__ import annotations

import random
import resource
from pathlib import Path

import pytest

from idem_platform.connectors.filedrop import files as files_module
from idem_platform.connectors.filedrop.files import hash_file
from idem_platform.connectors.filedrop.reader import read_split
from idem_platform.errors import FileChangedError


def read_all(path: Path, split_bytes: int, *, max_line_bytes: int = 1 << 20, block: int = 1 << 20) -> list[tuple[int, bytes, int]]:
    file = hash_file(path, max_split_bytes=split_bytes, chunk_bytes=7919)
    out = []
    for split in file.splits:
        for batch in read_split(file, split, 0, max_line_bytes=max_line_bytes, block_bytes=block):
            rows = zip(batch.column("_offset").to_pylist(), batch.column("_raw").to_pylist(), batch.column("_raw_length").to_pylist(), strict=True)
            out.extend(rows)
    return out


def test_splits_and_reader_reproduce_every_line_with_its_number(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files_module, "MIN_SPLIT_BYTES", 1)
    rng = random.Random(1)
    for trial in range(60):
        lines = [bytes(rng.choice(b'ab{}" \r') for _ in range(rng.choice([0, 1, 9, 80, 700]))) for _ in range(rng.randint(0, 120))]
        data = b"\n".join(lines) + (b"\n" if rng.random() < 0.5 else b"")
        path = tmp_path / f"f{trial}.ndjson"
        path.write_bytes(data)
        got = read_all(path, rng.choice([1, 64, 1000, 10**6]), block=rng.choice([3, 100, 4096]))
        expected = data.split(b"\n")[:-1] if data.endswith(b"\n") else (data.split(b"\n") if data else [])
        assert [line for line, _, _ in got] == list(range(1, len(expected) + 1))
        assert [raw.rstrip(b"\n") for _, raw, _ in got] == expected
        assert [length for _, _, length in got] == [len(e) for e in expected]
        assert hash_file(path).lines == len(expected)


def test_a_file_changed_after_hashing_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "f.ndjson"
    path.write_bytes(b'{"a":1}\n{"a":2}\n')
    file = hash_file(path)
    path.write_bytes(b'{"a":1}\n{"a":3}\n')
    with pytest.raises(FileChangedError, match="changed since it was hashed"):
        list(read_split(file, file.splits[0], 0, max_line_bytes=100))
    path.write_bytes(b'{"a":1}\n')
    with pytest.raises(FileChangedError, match="changed size"):
        list(read_split(file, file.splits[0], 0, max_line_bytes=100))


@pytest.mark.slow
def test_a_huge_file_is_hashed_and_read_in_bounded_memory(tmp_path: Path) -> None:
    """1 GiB with a single 1 GiB line (a sparse file): neither hashing nor reading holds it."""
    path = tmp_path / "huge.ndjson"
    size = 1 << 30
    with path.open("wb") as handle:
        handle.truncate(size - 1)
        handle.seek(size - 1)
        handle.write(b"\n")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    file = hash_file(path)
    rows = []
    for split in file.splits:
        for batch in read_split(file, split, 0, max_line_bytes=1 << 20):
            rows.extend(zip(batch.column("_offset").to_pylist(), batch.column("_raw_length").to_pylist(), strict=True))
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert file.lines == 1 and rows == [(1, size - 1)]
    assert grown_mib < 128, f"peak memory grew by {grown_mib:.0f} MiB"


def test_partition_keys_are_relative_names_and_never_leave_the_drop_directory(tmp_path: Path) -> None:
    from idem_platform.config import parse_config
    from idem_platform.defs.filedrop.partitions import partition_key_for, path_for_partition
    from idem_platform.errors import ConfigError

    text = "connectors:\n  - {name: feed, kind: filedrop, path: drop, record_type: t}\ntables:\n  t: {columns: {a: string}}\n"
    config_path = tmp_path / "idem.yaml"
    config_path.write_text(text)
    connector = parse_config(text, config_path).connector("feed")
    inside = tmp_path / "drop" / "day" / "f.ndjson"
    assert partition_key_for(connector, inside) == "day/f.ndjson"
    assert path_for_partition(connector, "day/f.ndjson") == inside
    outside_a = partition_key_for(connector, tmp_path / "a" / "f.ndjson")
    outside_b = partition_key_for(connector, tmp_path / "b" / "f.ndjson")
    assert outside_a.startswith("external/") and outside_a.endswith("/f.ndjson") and outside_a != outside_b
    assert str(tmp_path) not in outside_a  # no machine path in a partition key
    for bad in ("/etc/passwd", "../secret.ndjson", "day/../../x", outside_a):
        with pytest.raises(ConfigError):
            path_for_partition(connector, bad)


@pytest.mark.timeout(30)  # a plain open() of the FIFO would wait for a writer for ever
def test_a_fifo_put_in_a_files_place_is_refused_without_blocking(tmp_path: Path) -> None:
    """Whoever looked before saw a regular file; a FIFO swapped in since must not hang the reader."""
    import os

    from idem_platform.errors import RefusedFileError

    pipe = tmp_path / "feed.ndjson"
    os.mkfifo(pipe)
    with pytest.raises(RefusedFileError, match="a FIFO, not a regular file: refused"):
        hash_file(pipe)
    with pytest.raises(RefusedFileError, match="a FIFO, not a regular file: refused"):
        files_module.open_regular(pipe)  # the check at open, after the stat said "regular"
    regular = tmp_path / "ok.ndjson"
    regular.write_bytes(b'{"id":1}\n')
    with files_module.open_regular(regular) as handle:
        assert handle.read() == b'{"id":1}\n'
