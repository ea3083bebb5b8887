"""Hashing in chunks, line-aligned splits and the split reader: exact lines, bounded memory."""

from __future__ import annotations

import random
import resource
from pathlib import Path

import pytest

from idem_platform.errors import FileChangedError
from idem_platform.sources.filedrop import files as files_module
from idem_platform.sources.filedrop.files import DroppedFile, Split, hash_file
from idem_platform.sources.filedrop.plan import MIN_SLICE_BYTES, FileSlice, pack_slices
from idem_platform.sources.filedrop.reader import read_split


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


def _dropped(name: str, size: int, piece: int = 2 << 20) -> DroppedFile:
    """A hashed file as the planner sees it: ``size`` bytes in pieces of ``piece`` bytes."""
    starts = list(range(0, size, piece))
    splits = tuple(Split(start, min(start + piece, size), 1 + i, 0) for i, start in enumerate(starts))
    return DroppedFile(path=name, sha256=name * 4, size=size, mtime_ns=0, lines=len(splits), splits=splits)


def _pieces(slices: list[FileSlice]) -> list[tuple[str, int]]:
    return [(file.path, split.start) for piece in slices for file, split in piece.parts]


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        # One small file (a 1,000-line drop): one task.
        ([400_000], 1),
        # A 15 MB batch (the STIX-like case): two tasks (one wave on two cores), not eight;
        # each task pays its own job, connection and staging table per record type (~0.3 s
        # here) whatever it reads.
        ([15 << 20], 2),
        # 10 MB: one task (the cluster tests cut it in three with split_bytes, below).
        ([10 << 20], 1),
        # A thousand 400 kB files (a burst the sensor batches): the tasks of one 400 MB
        # file, dozens of files each, not a thousand tasks.
        ([400_000] * 1000, 14),
        # Ten 38.7 MB files, the shared benchmark's batch: what one 387 MB file makes
        # (six of 48 MB, then the last two slices' worth in quarters).
        ([38_700_000] * 10, 13),
        ([387_000_000], 13),
    ],
)
def test_slices_are_planned_over_the_batch_bytes(sizes: list[int], expected: int) -> None:
    files = [_dropped(f"f{i:04d}", size) for i, size in enumerate(sizes)]
    slices = pack_slices(files)
    assert len(slices) == expected
    # Every piece of every file exactly once, in file order: each line is read once.
    assert _pieces(slices) == [(f.path, s.start) for f in files for s in f.splits]
    if sum(sizes) >= 2 * MIN_SLICE_BYTES:
        assert min(piece.size for piece in slices) >= MIN_SLICE_BYTES // 2


def test_split_bytes_caps_a_slice_below_the_minimum() -> None:
    """``split_bytes`` is "at most this many bytes per slice", even under MIN_SLICE_BYTES:
    whoever sets it small wants more, smaller tasks (a cluster of many executors)."""
    files = [_dropped("f", 10 << 20)]
    slices = pack_slices(files, max_slice_bytes=4 << 20)
    assert [piece.size for piece in slices] == [4 << 20, 4 << 20, 2 << 20]
    assert _pieces(slices) == [(f.path, s.start) for f in files for s in f.splits]
