"""Start and stop a real Spark standalone cluster (1 master + N workers) on loopback.

Why this exists: ``local[*]`` runs executors inside the driver JVM, so it cannot show
what happens when Python runs in separate executor processes, when a machine dies,
or when tasks are retried/speculated on another executor.  This module launches the
master and worker JVMs of the pip-installed pyspark with ``spark-class`` so that
pytest fixtures can exercise those paths, and tears them down without orphans.

Process layout (what ``kill_worker`` and ``stop`` must deal with)::

    Popen (own session/pgid) -> spark-class (bash, exec's) -> Worker JVM
        Worker JVM -> CoarseGrainedExecutorBackend JVM (same pgid as worker)
            executor JVM -> python -m pyspark.daemon (calls setpgid(0, 0)!)
                daemon -> forked python workers

Because pyspark.daemon leaves the worker's process group, killing the process group
is not enough; we walk the /proc parent tree instead.  Every process started here
inherits the environment variable ``IDEM_SPARK_CLUSTER=<token>`` (executors and
python workers inherit the worker's environment), which lets ``stop`` find
stragglers even after they were re-parented to init.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, NoReturn

import pyspark

CLUSTER_ENV_MARKER = "IDEM_SPARK_CLUSTER"
EXECUTOR_MAIN_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"

# Failure detection tuned for tests (measured on a 2-core box, see probe notes):
# a SIGKILLed worker is noticed in <0.5 s anyway (sockets close); these settings bound
# the *silent* case (frozen / partitioned worker) to ~10 s instead of 60-120 s.
FAST_FAILURE_DAEMON_CONF: dict[str, str] = {
    # master: declare a worker DEAD after 5 s without heartbeat (checked every 5 s,
    # so 5-10 s).  Worker-lost failures do not count towards spark.task.maxFailures.
    "spark.worker.timeout": "5",
}
FAST_FAILURE_SESSION_CONF: dict[str, str] = {
    # driver: expire an executor with no heartbeat for 10 s; the check runs every
    # spark.network.timeoutInterval (default 60 s!), heartbeats must be << timeout.
    "spark.network.timeout": "10s",
    "spark.executor.heartbeatInterval": "1s",
    "spark.network.timeoutInterval": "1s",
}


# --------------------------------------------------------------------------- /proc


def _proc_stat(pid: int) -> tuple[int, str] | None:
    """Return (ppid, state) of *pid* or None if it is gone.

    /proc/<pid>/stat is parsed after the last ')' because the comm field may
    contain spaces or parentheses.
    """
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    return int(fields[1]), fields[0]


def _alive(pid: int) -> bool:
    """True if *pid* exists and is not a zombie (zombies hold no resources)."""
    st = _proc_stat(pid)
    return st is not None and st[1] not in ("Z", "X")


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _has_marker(pid: int, token: str) -> bool:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return f"{CLUSTER_ENV_MARKER}={token}".encode() in env.split(b"\0")


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for pid in _all_pids():
        st = _proc_stat(pid)
        if st is not None:
            children.setdefault(st[0], []).append(pid)
    return children


def descendants(pid: int) -> list[int]:
    """All live descendants of *pid* (children first, breadth-first), via /proc."""
    children = _children_map()
    out: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        p = todo.pop(0)
        if _alive(p):
            out.append(p)
        todo.extend(children.get(p, []))
    return out


def _signal_all(pids: list[int], sig: int) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


# --------------------------------------------------------------------------- cluster


@dataclass
class SparkCluster:
    """Handle on a running standalone cluster on loopback (see ``worker_hosts``)."""

    master_url: str
    master_proc: subprocess.Popen[bytes]
    worker_procs: list[subprocess.Popen[bytes]]
    work_dir: Path
    master_webui_url: str = ""
    token: str = ""
    worker_hosts: list[str] = field(default_factory=list)
    _logs: list[IO[bytes]] = field(default_factory=list, repr=False)

    # ---- inspection -------------------------------------------------------

    def worker_pids(self) -> list[int]:
        """JVM pids of the workers (Popen pid == JVM pid because spark-class exec's)."""
        return [p.pid for p in self.worker_procs]

    def executor_pids(self, index: int) -> list[int]:
        """Executor JVM pids launched by worker *index*: its direct children running
        CoarseGrainedExecutorBackend (their children are pyspark.daemon processes)."""
        wpid = self.worker_procs[index].pid
        kids = _children_map().get(wpid, [])
        return [p for p in kids if _alive(p) and EXECUTOR_MAIN_CLASS in _cmdline(p)]

    def worker_tree(self, index: int) -> list[int]:
        """Worker JVM + every descendant (executors, pyspark.daemon, python workers)."""
        wpid = self.worker_procs[index].pid
        return ([wpid] if _alive(wpid) else []) + descendants(wpid)

    def cluster_pids(self) -> list[int]:
        """Every live process carrying this cluster's env marker (includes orphans)."""
        return [
            p for p in _all_pids() if p != os.getpid() and _alive(p) and _has_marker(p, self.token)
        ]

    def session_conf(self, fast_failure_detection: bool = True) -> dict[str, str]:
        """SparkSession settings that fit this cluster; apply with builder.config(k, v).

        The pinned driver address keeps everything on loopback; the registration
        ratio makes the first job wait for every executor (otherwise it may run all
        tasks on whichever executor registered first).  Note that the *first*
        session of a Python process passes its conf to the gateway JVM as
        spark-submit ``--conf`` and those stick as JVM system properties, so a later
        session in the same process inherits keys it does not set itself.
        """
        conf = {
            "spark.master": self.master_url,
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.executor.memory": "512m",
            "spark.executor.cores": "1",
            "spark.cores.max": str(len(self.worker_procs)),
            "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": "60s",
        }
        if fast_failure_detection:
            conf.update(FAST_FAILURE_SESSION_CONF)
        return conf

    def master_state(self) -> dict:
        """The master's /json/ document (workers, their state, apps)."""
        with urllib.request.urlopen(f"{self.master_webui_url}/json/", timeout=5) as r:
            return json.loads(r.read())

    # ---- fault injection --------------------------------------------------

    def kill_worker(self, index: int) -> list[int]:
        """Simulate losing the machine of worker *index*; returns the killed pids.

        A machine loss means the worker, its executors and their python processes
        vanish together with no shutdown hooks running.  We SIGSTOP the whole tree
        first so nobody can fork or react (e.g. the worker relaunching an executor),
        re-scan to catch late children, then SIGKILL everything.

        Note: on loopback the kernel still closes the sockets (RST/FIN), so master and
        driver notice immediately.  A *silent* loss (power off, partition) is closer
        to ``freeze_worker``, which only heartbeat timeouts can detect.
        """
        tree = self.worker_tree(index)
        _signal_all(tree, signal.SIGSTOP)
        tree = sorted(set(tree) | set(self.worker_tree(index)))
        _signal_all(tree, signal.SIGSTOP)
        _signal_all(tree, signal.SIGKILL)
        self.worker_procs[index].wait(timeout=10)  # reap the zombie
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in tree) and time.monotonic() < deadline:
            time.sleep(0.05)
        return tree

    def freeze_worker(self, index: int) -> list[int]:
        """SIGSTOP the worker tree: sockets stay open but nothing answers, like a
        network partition.  Undo with ``thaw_worker``; ``stop`` also cleans up."""
        tree = self.worker_tree(index)
        _signal_all(tree, signal.SIGSTOP)
        return tree

    def thaw_worker(self, index: int) -> None:
        """SIGCONT the worker tree frozen by ``freeze_worker``."""
        _signal_all(self.worker_tree(index), signal.SIGCONT)

    # ---- teardown ---------------------------------------------------------

    def stop(self, timeout: float = 20.0) -> None:
        """Terminate workers, then the master; SIGKILL whatever is left; verify.

        SIGTERM first so the worker's shutdown hook kills its executors cleanly;
        anything still carrying the cluster marker after *timeout* is SIGKILLed
        (including orphans re-parented to init).  Raises if a process survives.
        """
        procs = [*self.worker_procs, self.master_proc]
        # Frozen (SIGSTOPped) processes cannot handle SIGTERM, and waking them lets a
        # worker act on queued master messages (e.g. launch a replacement executor
        # mid-teardown), so kill them outright.
        frozen = [p for p in self.cluster_pids() if (_proc_stat(p) or (0, ""))[1] in ("T", "t")]
        _signal_all(frozen, signal.SIGKILL)
        for p in self.worker_procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + timeout / 2
        for p in self.worker_procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        if self.master_proc.poll() is None:
            self.master_proc.terminate()
        try:
            self.master_proc.wait(timeout=timeout / 2)
        except subprocess.TimeoutExpired:
            pass
        for _ in range(3):
            left = self.cluster_pids()
            if not left:
                break
            _signal_all(left, signal.SIGKILL)
            time.sleep(0.5)
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)
        for f in self._logs:
            f.close()
        atexit.unregister(self._stop_quietly)
        survivors = self.cluster_pids()
        if survivors:
            raise RuntimeError(f"Spark cluster processes survived stop(): {survivors}")

    def _stop_quietly(self) -> None:
        try:
            self.stop(timeout=10)
        except Exception:  # noqa: BLE001 - interpreter is exiting, best effort
            pass


# --------------------------------------------------------------------------- start


def free_port(host: str = "127.0.0.1") -> int:
    """Ask the kernel for an unused port on *host* (tiny race until the JVM binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except FileNotFoundError:
        return "<no log>"


def start_spark_cluster(
    work_dir: Path,
    workers: int = 2,
    cores_per_worker: int = 1,
    memory: str = "1g",
    *,
    daemon_conf: Mapping[str, str] | None = None,
    timeout: float = 90.0,
    die_with_parent: bool = True,
    distinct_hosts: bool = True,
) -> SparkCluster:
    """Start a master and *workers* workers on loopback and wait until all are ALIVE.

    With ``distinct_hosts`` (default) worker *i* binds 127.0.0.<i+2> (all of 127/8 is
    loopback on Linux), the master and driver stay on 127.0.0.1.  Spark reasons per
    *host*: it never runs a speculative copy on a host that already runs the task,
    host-level excludeOnFailure would take out every worker at once, and losing a
    worker unregisters the shuffle output of every executor on the same host.  With
    all workers on 127.0.0.1 those code paths behave unlike a real cluster.

    All ports are picked free (never 7077/8080/8081) so parallel test sessions and
    other local Spark installs do not collide.  ``daemon_conf`` is passed as ``-D``
    options to master and workers (e.g. ``spark.worker.timeout``, which is a
    master-side setting and cannot be changed from the SparkSession); pass
    ``FAST_FAILURE_DAEMON_CONF`` together with ``session_conf()`` for quick detection.

    Orphan protection: ``stop`` is registered with ``atexit`` (normal exit, uncaught
    exceptions), and with ``die_with_parent`` master and workers are started under
    ``setpriv --pdeathsig KILL`` so they die even if the test process is SIGKILLed
    (their executors then exit on their own when the worker connection drops).
    pdeathsig fires when the *thread* that called this function exits, so call it
    from the main thread (pytest session fixtures do) or pass ``die_with_parent=False``.
    """
    work_dir = Path(work_dir).resolve()
    spark_home = Path(pyspark.__file__).parent
    log_dir = work_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    # The REST submission server would grab the fixed port 6066; tests never need it.
    conf = {"spark.master.rest.enabled": "false", **(daemon_conf or {})}
    daemon_opts = " ".join(f"-D{k}={v}" for k, v in conf.items())

    base_env = dict(os.environ)
    base_env.update(
        SPARK_HOME=str(spark_home),
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOG_DIR=str(log_dir),
        SPARK_DAEMON_MEMORY="512m",  # master/worker heap; they need little
        SPARK_DAEMON_JAVA_OPTS=daemon_opts,
        SPARK_NO_DAEMONIZE="1",
        **{CLUSTER_ENV_MARKER: token},
    )
    # Do not let a developer's SPARK_CONF_DIR or driver-side settings leak in.
    for k in ("SPARK_CONF_DIR", "PYSPARK_SUBMIT_ARGS", "SPARK_MASTER_OPTS", "SPARK_WORKER_OPTS"):
        base_env.pop(k, None)
    spark_class = str(spark_home / "bin" / "spark-class")
    setpriv = shutil.which("setpriv") if die_with_parent else None
    prefix = [setpriv, "--pdeathsig", "KILL"] if setpriv else []

    logs: list[IO[bytes]] = []

    def launch(name: str, args: list[str], extra_env: dict[str, str]) -> subprocess.Popen[bytes]:
        out = open(log_dir / f"{name}.log", "wb")
        logs.append(out)
        return subprocess.Popen(
            [*prefix, spark_class, *args],  # setpriv and spark-class both exec: pid == JVM
            env={**base_env, **extra_env},
            cwd=work_dir,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: Ctrl-C in pytest doesn't hit it
        )

    master_port, master_ui = free_port(), free_port()
    master_url = f"spark://127.0.0.1:{master_port}"
    master = launch(
        "master",
        [
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(master_port),
            "--webui-port",
            str(master_ui),
        ],
        {},
    )
    cluster = SparkCluster(
        master_url=master_url,
        master_proc=master,
        worker_procs=[],
        work_dir=work_dir,
        master_webui_url=f"http://127.0.0.1:{master_ui}",
        token=token,
        _logs=logs,
    )

    atexit.register(cluster._stop_quietly)

    def fail(reason: str) -> NoReturn:
        tails = "\n".join(f"--- {p.name} ---\n{_tail(p)}" for p in sorted(log_dir.glob("*.log")))
        try:
            cluster.stop(timeout=10)
        finally:
            raise RuntimeError(f"Spark cluster did not start: {reason}\n{tails}")

    deadline = time.monotonic() + timeout
    # Start workers only once the master answers: a worker that cannot register
    # backs off for several seconds, which would slow every test session.
    while True:
        if master.poll() is not None:
            fail(f"master exited with {master.returncode}")
        try:
            # Authoritative URL: Spark silently moves to port+1 if ours was taken.
            cluster.master_url = master_url = cluster.master_state()["url"]
            break
        except ValueError:
            # Not JSON: another process took the UI port between free_port() and the JVM's
            # bind (an HTML page of another Spark UI was seen here), so the master's UI moved.
            bound = re.findall(r"Successfully started service 'MasterUI' on port (\d+)", _tail(log_dir / "master.log", 400))
            if bound:
                cluster.master_webui_url = f"http://127.0.0.1:{bound[-1]}"
            if time.monotonic() > deadline:
                fail("master web UI never answered with its JSON")
            time.sleep(0.25)
        except OSError:
            if time.monotonic() > deadline:
                fail("master web UI never answered")
            time.sleep(0.25)

    for i in range(workers):
        host = f"127.0.0.{i + 2}" if distinct_hosts else "127.0.0.1"
        cluster.worker_hosts.append(host)
        wdir = work_dir / f"worker{i}"
        (wdir / "work").mkdir(parents=True, exist_ok=True)
        (wdir / "local").mkdir(parents=True, exist_ok=True)
        cluster.worker_procs.append(
            launch(
                f"worker{i}",
                [
                    "org.apache.spark.deploy.worker.Worker",
                    master_url,
                    "--host",
                    host,
                    "--port",
                    str(free_port(host)),
                    "--webui-port",
                    str(free_port(host)),
                    "--cores",
                    str(cores_per_worker),
                    "--memory",
                    memory,
                    "--work-dir",
                    str(wdir / "work"),
                ],
                {
                    "SPARK_LOCAL_IP": host,  # inherited by executors and python workers
                    "SPARK_WORKER_DIR": str(wdir / "work"),
                    "SPARK_LOCAL_DIRS": str(wdir / "local"),
                },
            )
        )

    while True:
        dead = [i for i, p in enumerate(cluster.worker_procs) if p.poll() is not None]
        if dead:
            fail(f"worker(s) {dead} exited")
        try:
            listed = cluster.master_state().get("workers", [])
            alive = [w for w in listed if w.get("state") == "ALIVE"]
        except OSError:
            alive = []
        if len(alive) >= workers:
            return cluster
        if time.monotonic() > deadline:
            fail(f"only {len(alive)}/{workers} workers ALIVE after {timeout:.0f}s")
        time.sleep(0.25)
