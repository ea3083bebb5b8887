"""A class-data-sharing archive of Spark's classes: the driver JVM starts in ~3.5 s instead of ~6 s.

Every Dagster run is a new process with a new driver JVM, so JVM start-up is
paid per run. A dynamic AppCDS archive (JDK 13+) of the classes a session and
an Arrow job load is built once per machine, in a separate short process, and
every later session maps it (``-XX:SharedArchiveFile``). A missing or stale
archive (another JDK, another Spark) is simply not used: the JVM falls back to
loading classes the normal way, so this can only make start-up faster.

Build it ahead of time with ``python -m idem_platform.spark.cds`` (``make
install`` does); otherwise the first session starts building it in the background.

The figure this serves: a small ``idem ingest`` with Spark in its own process (the table
in ``docs/operations.md``); without the archive its median wall time was 17 % longer on
the 2-core machine (5-line files, three pairs, measured side by side).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

from idem_platform.settings import idem_home

_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off -Xshare:auto"


def archive_path(home: Path | None = None) -> Path:
    """Where this interpreter's archive lives (per Spark version and Java binary)."""
    import pyspark

    java = shutil.which("java") or "java"
    tag = f"{pyspark.__version__}-{zlib.crc32(os.path.realpath(java).encode()):08x}"
    return (home or idem_home()) / "spark-cds" / f"spark-{tag}.jsa"


def java_options(existing: str | None) -> str | None:
    """The driver's JVM options with the archive mapped in (or ``None`` to leave them alone)."""
    if existing and "SharedArchiveFile" in existing:
        return None
    archive = archive_path()
    if not archive.exists():
        _build_in_background(archive)
        return None
    return " ".join(part for part in (existing, f"-XX:SharedArchiveFile={archive}", _QUIET) if part)


def _build_in_background(archive: Path) -> None:
    lock = archive.with_suffix(".building")
    try:
        archive.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except OSError:
        return  # another process is building it (or cannot write here)
    os.close(descriptor)
    subprocess.Popen(
        [sys.executable, "-m", "idem_platform.spark.cds", str(archive)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


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
    import pyspark

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the job's Python: this one
    for stale in archive.parent.glob("*.tmp"):  # left by a builder that was killed
        stale.unlink(missing_ok=True)
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


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else archive_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        print(target if target.exists() else build(target))
    finally:
        target.with_suffix(".building").unlink(missing_ok=True)
