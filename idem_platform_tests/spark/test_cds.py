"""The JVM class-data archive: built only when asked, shared by every idem home, used when present."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from idem_platform.spark.cds import archive_path
from idem_platform.spark.session import driver_java_options


def _children() -> set[int]:
    """This process's child processes, from ``/proc`` (what a background builder would be)."""
    own = os.getpid()
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # it ended while we looked
            if int(fields[1]) == own:
                found.add(int(entry.name))
    return found


def test_a_run_in_a_fresh_home_builds_no_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, the first session of every new idem home spawned a ~150 MB archive build."""
    home, cache = tmp_path / "home", tmp_path / "cache"
    monkeypatch.setenv("IDEM_HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    before = _children()
    options = driver_java_options(None) or ""
    assert "SharedArchiveFile" not in options
    assert _children() - before == set(), "a run started a process"
    assert not home.exists() and not cache.exists(), "a run wrote an archive (or its lock)"


def test_the_archive_lives_per_installation_and_is_used_when_present(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    archive = archive_path()
    for home in ("one", "two"):  # not under any idem home: every home finds the same file
        monkeypatch.setenv("IDEM_HOME", str(tmp_path / home))
        assert archive_path() == archive and archive.is_relative_to(cache)
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"")  # the JVM checks the archive itself (-Xshare:auto): here only the option
    options = driver_java_options("-Dx=1") or ""
    assert f"-XX:SharedArchiveFile={archive}" in options and "-Xshare:auto" in options and "-Dx=1" in options
    mine = "-XX:SharedArchiveFile=/mine.jsa -XX:TieredStopAtLevel=1 -Dlog4j.configurationFile=/mine.properties"
    assert driver_java_options(mine) is None  # the user's archive, JIT and log configuration win
