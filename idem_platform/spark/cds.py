"""A class-data-sharing archive of Spark's classes: the driver JVM starts in ~3.5 s instead of ~6 s.

Every Dagster run is a new process with a new driver JVM, so JVM start-up is
paid per run. A dynamic AppCDS archive (JDK 13+) of the classes a session and
an Arrow job load is built once per installation, in a separate short process, and
every later session maps it (``-XX:SharedArchiveFile``).

It is built only when asked: ``make install`` (which runs ``python -m
idem_platform.spark.cds``) or ``idem spark cds``. A run never builds it: building
takes a JVM's worth of CPU and ~150 MB for a minute, which on a small machine made
the first run in a new idem home three to five times slower. A run without it starts
the JVM the normal way.

It lives in the user's cache directory (:func:`idem_platform.settings.cache_home`),
not in an idem home, so every home and every test of one installation reuses it. Its
name carries the Spark version and a hash of the Java binary and of the PySpark
installation: another JDK, another Spark or another virtual environment looks for
another file. A stale file that still matches (a JDK upgraded in place) is refused by
the JVM itself, which with ``-Xshare:auto`` then loads classes the normal way, so the
archive can only make start-up faster.

The figure this serves: a small ``idem ingest`` with Spark in its own process (the table
in ``docs/operations.md``); without the archive its median wall time was 17 % longer on
the 2-core machine (5-line files, three pairs, measured side by side).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import pyspark

from idem_platform.settings import cache_home

_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off -Xshare:auto"
_STALE_TEMPORARY_S = 3600  # a builder's temporary file this old was left by a killed builder


def archive_path(cache: Path | None = None) -> Path:
    """Where this installation's archive lives (per Spark version, Java binary and PySpark install)."""
    java = os.path.realpath(shutil.which("java") or "java")
    install = os.path.realpath(Path(pyspark.__file__).parent)
    tag = f"{pyspark.__version__}-{zlib.crc32(f'{java}|{install}'.encode()):08x}"
    return (cache or cache_home()) / "spark-cds" / f"spark-{tag}.jsa"


def java_options(existing: str | None) -> str | None:
    """The driver's JVM options with the archive mapped in, or ``None`` to leave them alone
    (the user mapped one, or there is none: then nothing is built, see the module's note)."""
    if existing and "SharedArchiveFile" in existing:
        return None
    archive = archive_path()
    if not archive.is_file():
        return None
    return " ".join(part for part in (existing, f"-XX:SharedArchiveFile={archive}", _QUIET) if part)


# The job the archive is recorded from: a session and an Arrow job, as a run's first steps load them.
_JOB = """
from pyspark.sql import SparkSession

def body(batches):
    yield from batches

spark = SparkSession.builder.getOrCreate()
spark.range(0, 2, 1, numPartitions=2).mapInArrow(body, "id long").toArrow()
spark.stop()
"""


def build(archive: Path) -> Path:
    """Run a small Arrow job under ``spark-submit`` with ``-XX:ArchiveClassesAtExit``; keep the archive.

    ``spark-submit`` (Spark's documented launcher) runs the driver JVM in its own process,
    so the JVM writes the archive as that process ends and waiting for it is enough: no
    handle on PySpark's gateway process is needed.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the job's Python: this one
    archive.parent.mkdir(parents=True, exist_ok=True)
    for stale in archive.parent.glob("*.tmp"):  # left by a builder that was killed
        with contextlib.suppress(OSError):  # another builder may remove it first
            if time.time() - stale.stat().st_mtime > _STALE_TEMPORARY_S:
                stale.unlink()
    temporary = archive.with_suffix(f".{os.getpid()}.tmp")
    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    with tempfile.TemporaryDirectory(prefix="idem-cds-") as directory:
        job = Path(directory) / "cds_job.py"
        job.write_text(_JOB, encoding="utf-8")
        subprocess.run(
            [
                str(submit), "--master", "local[2]",
                "--conf", "spark.ui.enabled=false", "--conf", "spark.ui.showConsoleProgress=false",
                "--driver-java-options", f"-XX:ArchiveClassesAtExit={temporary} -Xlog:cds=off -Xlog:cds+dynamic=off",
                str(job),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=600,
            check=False,
        )
    if temporary.exists():
        temporary.replace(archive)
    return archive


def ensure(archive: Path | None = None) -> Path | None:
    """Build the archive unless it exists; its path, or ``None`` if the JVM wrote none."""
    target = archive or archive_path()
    if not target.is_file():
        build(target)
    return target if target.is_file() else None


if __name__ == "__main__":
    built = ensure(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
    print(built or "no archive written (a JDK without dynamic CDS?)")
