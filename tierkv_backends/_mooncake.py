"""Mooncake Store helpers for the ``rdma`` backend: the error-code table and the
lifecycle of a private ``mooncake_master`` on 127.0.0.1.

Nothing here imports ``mooncake`` at module import time; :func:`find_master_binary`
only looks the file up. :class:`MasterProcess` is synchronous (it is used from
tests, from benchmarks and, through ``anyio.to_thread``, from the backend).

Error codes: Mooncake's Python client returns plain ``int`` status codes (0 or a
byte count on success, a negative ``ErrorCode`` on failure). :data:`ERROR_CODES`
maps each known code to its name and to the tierkv exception it becomes;
:func:`translate` builds that exception. ``docs/rdma.md`` carries the same table.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tierkv.errors import (
    BackendError,
    BackendIOError,
    BlockExistsError,
    BlockNotFoundError,
    CapacityError,
    IntegrityError,
)

__all__ = [
    "ERROR_CODES",
    "MasterProcess",
    "MasterStartError",
    "MooncakeCode",
    "code_name",
    "find_master_binary",
    "free_ports",
    "translate",
]


@dataclass(frozen=True, slots=True)
class MooncakeCode:
    """One row of the error-code table."""

    code: int
    name: str
    error: type[BackendError]
    meaning: str


def _rows() -> dict[int, MooncakeCode]:
    rows = [
        (-1, "INTERNAL_ERROR", BackendIOError, "internal error in the client or master"),
        (-10, "BUFFER_OVERFLOW", BackendIOError, "destination buffer too small"),
        (-100, "SHARD_INDEX_OUT_OF_RANGE", BackendIOError, "master shard index out of range"),
        (-101, "SEGMENT_NOT_FOUND", BackendIOError, "no mounted segment (the peer holding it is gone)"),
        (-102, "SEGMENT_ALREADY_EXISTS", BackendIOError, "segment already mounted"),
        (-103, "CLIENT_NOT_FOUND", BackendIOError, "master does not know this client (it restarted)"),
        (-200, "NO_AVAILABLE_HANDLE", CapacityError, "the pool has no space for the object"),
        (-300, "INVALID_VERSION", BackendIOError, "version mismatch"),
        (-400, "INVALID_KEY", BackendIOError, "invalid object key"),
        (-500, "WRITE_FAIL", BackendIOError, "write failed"),
        (-600, "INVALID_PARAMS", BackendIOError, "invalid parameters (buffer smaller than the stored object)"),
        (-601, "ILLEGAL_CLIENT", BackendIOError, "client not allowed to do the operation"),
        (-700, "INVALID_WRITE", BackendIOError, "invalid write"),
        (-701, "INVALID_READ", BackendIOError, "invalid read"),
        (-702, "INVALID_REPLICA", BackendIOError, "invalid replica"),
        (-703, "REPLICA_IS_NOT_READY", BlockNotFoundError, "object is still being written (not committed)"),
        (-704, "OBJECT_NOT_FOUND", BlockNotFoundError, "no such object (never written, removed or evicted)"),
        (-705, "OBJECT_ALREADY_EXISTS", BlockExistsError, "an object with that key exists"),
        (-706, "OBJECT_HAS_LEASE", BackendIOError, "object is under a read lease (remove retried or forced)"),
        (-707, "LEASE_EXPIRED", BlockNotFoundError, "lease expired before the transfer completed; data dropped"),
        (-708, "OBJECT_HAS_REPLICATION_TASK", BackendIOError, "object has a replication task running"),
        (-709, "OBJECT_NO_REPLICATION_TASK", BackendIOError, "object has no replication task"),
        (-710, "REPLICA_NOT_FOUND", BlockNotFoundError, "replica not found"),
        (-711, "REPLICA_ALREADY_EXISTS", BackendIOError, "replica already exists"),
        (-712, "REPLICA_IS_GONE", BlockNotFoundError, "replica existed but is gone (evicted)"),
        (-713, "REPLICA_NOT_IN_LOCAL_MEMORY", BackendIOError, "replica not in local memory"),
        (-714, "OBJECT_REPLICA_BUSY", BackendIOError, "replica busy"),
        (-800, "TRANSFER_FAIL", BackendIOError, "transfer engine failed (peer down, network error)"),
        (-801, "CHECKSUM_MISMATCH", IntegrityError, "Mooncake's own checksum failed"),
        (-900, "RPC_FAIL", BackendIOError, "RPC to the master failed (master down or unreachable)"),
        (-901, "RPC_TIMEOUT", BackendIOError, "RPC to the master timed out"),
        (-1000, "ETCD_OPERATION_ERROR", BackendIOError, "metadata (etcd) operation failed"),
        (-1001, "ETCD_KEY_NOT_EXIST", BackendIOError, "metadata key missing"),
        (-1010, "UNAVAILABLE_IN_CURRENT_STATUS", BackendIOError, "master not serving (starting or failing over)"),
        (-1011, "UNAVAILABLE_IN_CURRENT_MODE", BackendIOError, "operation not available in this master mode"),
    ]
    return {c: MooncakeCode(c, n, e, m) for c, n, e, m in rows}


#: Mooncake ``ErrorCode`` -> name, tierkv exception, meaning. Unknown negative
#: codes become :class:`~tierkv.BackendIOError`.
ERROR_CODES: Mapping[int, MooncakeCode] = _rows()


def code_name(code: int) -> str:
    """``"OBJECT_NOT_FOUND(-704)"`` for a known code, ``"ERROR(-42)"`` otherwise."""
    row = ERROR_CODES.get(code)
    return f"{row.name}({code})" if row else f"ERROR({code})"


def translate(code: int, *, op: str, key: str = "", tier: str = "") -> BackendError:
    """The tierkv exception (not raised) for a negative Mooncake status ``code``."""
    row = ERROR_CODES.get(code)
    cls: type[BackendError] = row.error if row else BackendIOError
    meaning = row.meaning if row else "unknown Mooncake error code"
    what = f"{op} {key!r}" if key else op
    msg = f"mooncake {what} failed: {code_name(code)}: {meaning}"
    return cls(msg, tier=tier)


# --------------------------------------------------------------------- master
class MasterStartError(RuntimeError):
    """``mooncake_master`` did not become ready; ``log`` holds the path of its log."""

    def __init__(self, message: str, log: Path | None) -> None:
        self.log = log
        super().__init__(message + (f" (log kept at {log})" if log else ""))


def find_master_binary() -> Path | None:
    """The ``mooncake_master`` executable shipped in the Mooncake wheel (or on PATH)."""
    spec = importlib.util.find_spec("mooncake")
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            cand = Path(loc) / "mooncake_master"
            if cand.is_file():
                if not os.access(cand, os.X_OK):
                    with contextlib.suppress(OSError):
                        cand.chmod(cand.stat().st_mode | 0o111)
                return cand
    found = shutil.which("mooncake_master")
    return Path(found) if found else None


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports free on ``host`` right now (the kernel picks them)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass(slots=True)
class MasterProcess:
    """A ``mooncake_master`` bound to 127.0.0.1 on free ports.

    ``start()`` launches it (RPC, metrics/admin and, with ``http_metadata``, the
    built-in HTTP metadata server, all on ``host``), waits until its ``/health``
    endpoint answers ``service_ready`` and returns ``self``. ``stop()`` sends
    SIGTERM then SIGKILL to the pid it started (never by name); ``kill()`` sends
    SIGKILL at once (failure tests). ``restart()`` starts it again on the same
    ports. The log file is removed on a clean stop unless ``keep_log`` is set, and
    kept (its path is in the error) when the start fails.

    Not thread-safe; one owner.
    """

    log_dir: Path
    http_metadata: bool = False
    host: str = "127.0.0.1"
    lease_ttl_ms: int = 10_000
    client_ttl_s: int = 10
    eviction_high_watermark: float = 0.9
    extra_args: tuple[str, ...] = ()
    keep_log: bool = False
    ready_timeout: float = 30.0
    rpc_port: int = 0
    metrics_port: int = 0
    http_port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    starts: int = 0
    _binary: Path | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        """``host:rpc_port`` for ``master_server_addr``."""
        return f"{self.host}:{self.rpc_port}"

    @property
    def metadata_url(self) -> str:
        """The HTTP metadata server URL (``http_metadata`` only)."""
        return f"http://{self.host}:{self.http_port}/metadata"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> MasterProcess:
        """Start and wait until ready. Raises MasterStartError (log kept) on failure."""
        if self.alive():
            return self
        binary = self._binary or find_master_binary()
        if binary is None:
            raise MasterStartError("mooncake_master not found (pip install mooncake-transfer-engine-non-cuda)", None)
        self._binary = binary
        if not self.rpc_port:
            self.rpc_port, self.metrics_port, self.http_port = free_ports(3, self.host)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        self.log_path = self.log_dir / f"mooncake_master.{self.rpc_port}.{self.starts}.log"
        args = [
            str(binary),
            f"--rpc_address={self.host}",
            f"--rpc_port={self.rpc_port}",
            f"--metrics_host={self.host}",
            f"--metrics_port={self.metrics_port}",
            f"--default_kv_lease_ttl={self.lease_ttl_ms}",
            f"--client_ttl={self.client_ttl_s}",
            f"--eviction_high_watermark_ratio={self.eviction_high_watermark}",
            "--logtostderr=true",
        ]
        if self.http_metadata:
            args += [
                "--enable_http_metadata_server=true",
                f"--http_metadata_server_host={self.host}",
                f"--http_metadata_server_port={self.http_port}",
            ]
        args += list(self.extra_args)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            self._wait_ready()
        except BaseException:
            self._terminate(keep_log=True)
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        url = f"http://{self.host}:{self.metrics_port}/health"
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise MasterStartError(f"mooncake_master exited with status {self.proc.returncode}", self.log_path)
            try:
                with urllib.request.urlopen(url, timeout=1.0) as resp:
                    body = resp.read().decode("utf-8", "replace")
                if '"service_ready":true' in body.replace(" ", "") and self._rpc_open():
                    return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.05)
        raise MasterStartError(f"mooncake_master not ready after {self.ready_timeout:.0f}s", self.log_path)

    def _rpc_open(self) -> bool:
        try:
            with socket.create_connection((self.host, self.rpc_port), timeout=0.5):
                return True
        except OSError:
            return False

    def log_text(self) -> str:
        """The current log (empty when there is none)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text("utf-8", "replace")

    def kill(self) -> None:
        """SIGKILL the master (simulates a crash); keeps its log."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def restart(self) -> MasterProcess:
        """Start again on the same ports (after :meth:`kill` or :meth:`stop`)."""
        self.kill()
        return self.start()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s; removes the log unless ``keep_log``."""
        self._terminate(keep_log=self.keep_log)

    def _terminate(self, *, keep_log: bool) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=10)
        if not keep_log and self.log_path is not None:
            with contextlib.suppress(OSError):
                self.log_path.unlink()

    def __enter__(self) -> MasterProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self._terminate(keep_log=self.keep_log or exc[0] is not None)
