"""Run untrusted generated programs in a contained subprocess.

Layers, outermost first (each catches what the one inside may miss):

1. A dedicated unprivileged uid per run when we are root (`_lease_uid`): RLIMIT_NPROC is per uid and
   ignored for root, so without this a fork bomb is not bounded; it also lets us sweep every process
   of that uid at the end, which is how "the machine is clean" is guaranteed.
2. `prlimit`: address space (a 10 GB allocation fails), CPU seconds (a busy loop gets SIGXCPU/SIGKILL),
   process count (fork bomb), file size, open files, no core dumps. `prlimit` rather than a Python
   `preexec_fn` because preexec_fn is unsafe when the grader runs in threads.
3. bubblewrap: new network namespace (no network at all), pid namespace (everything dies with the
   sandbox's init), read-only root, the program's own directory (mounted at /tmp/box) as the only
   writable place; the rest of /tmp is an empty read-only tmpfs. Where bwrap is missing or cannot
   create namespaces we fall back to `unshare` for the network/pid namespaces and warn once, because
   the file system is then protected only by the uid.
4. Wall-clock timeout in the parent, then SIGKILL to the process group and the uid sweep.

stdout/stderr go to files the sandbox cannot see (capped by RLIMIT_FSIZE) so a program that prints
forever cannot fill the harness's memory.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

# uids that no real account uses; each concurrent run gets its own so process limits and the final
# sweep never touch another run (or a real user).
UID_BASE = int(os.environ.get("INFIR_SANDBOX_UID_BASE", "61000"))
UID_COUNT = 1000
_uid_counter = itertools.count(os.getpid() % UID_COUNT)
_uid_lock = threading.Lock()
_LEASE_DIR = Path(tempfile.gettempdir()) / "infir-sandbox-uids"
_MOUNT_POINT = "/tmp/box"  # where the program's directory appears inside bwrap


@dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0
    cpu_s: int = 10
    memory_bytes: int = 2 << 30
    max_processes: int = 64
    max_file_bytes: int = 64 << 20
    max_open_files: int = 256

    def __post_init__(self):
        for name in ("wall_s", "cpu_s", "memory_bytes", "max_processes", "max_file_bytes", "max_open_files"):
            if getattr(self, name) <= 0:
                raise ValueError(f"sandbox Limits.{name} must be > 0, got {getattr(self, name)}")


@dataclass
class RunResult:
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    isolation: str  # "bwrap", "unshare" or "rlimits": what contained this run

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def _is_root() -> bool:
    return os.geteuid() == 0


@contextlib.contextmanager
def _lease_uid():
    """A sandbox uid no other run (in this process or another) holds until the block ends, or None
    when we are not root. The lease is an flock, so a crashed holder frees it automatically."""
    if not _is_root():
        yield None
        return
    _LEASE_DIR.mkdir(exist_ok=True)
    for _ in range(UID_COUNT):
        with _uid_lock:
            uid = UID_BASE + next(_uid_counter) % UID_COUNT
        lock = open(_LEASE_DIR / str(uid), "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        try:
            yield uid
        finally:
            lock.close()  # releases the flock
        return
    raise RuntimeError(f"sandbox: all {UID_COUNT} sandbox uids are busy; lower grading.workers")


@functools.lru_cache(maxsize=None)
def isolation_mode() -> str:
    """The strongest isolation that works on this machine (probed once, as the sandbox uid would run)."""
    uid = UID_BASE + UID_COUNT if _is_root() else None  # a probe uid outside the pool
    if shutil.which("bwrap"):
        probe = subprocess.run(_bwrap_prefix("/") + ["true"], user=uid, capture_output=True, timeout=30)
        if probe.returncode == 0:
            return "bwrap"
        reason = probe.stderr.decode(errors="replace").strip()
    else:
        reason = "bwrap is not installed"
    if shutil.which("unshare"):
        probe = subprocess.run(_unshare_prefix() + ["true"], user=uid, capture_output=True, timeout=30)
        mode = "unshare" if probe.returncode == 0 else "rlimits"
    else:
        mode = "rlimits"
    namespaces = "no network or pid namespaces" if mode == "rlimits" else "network and pid namespaces"
    files = "protected only by a dedicated uid" if _is_root() else "NOT protected (run as root)"
    warnings.warn(
        f"sandbox: bubblewrap unusable ({reason}); falling back to {mode}: {namespaces}, file system {files}. "
        "Fix: `apt-get install -y bubblewrap` on a host that allows user namespaces.",
        RuntimeWarning,
        stacklevel=2,
    )
    return mode


def _bwrap_prefix(workdir: str) -> list[str]:
    return [
        "bwrap", "--unshare-all", "--die-with-parent", "--new-session",
        "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
        "--bind", workdir, _MOUNT_POINT, "--remount-ro", "/tmp", "--chdir", _MOUNT_POINT,
        "--clearenv", "--setenv", "PATH", _SANDBOX_PATH, "--setenv", "HOME", _MOUNT_POINT,
        "--setenv", "TMPDIR", _MOUNT_POINT, "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
        "--setenv", "OMP_NUM_THREADS", "1", "--setenv", "OPENBLAS_NUM_THREADS", "1", "--",
    ]


def _unshare_prefix() -> list[str]:
    return ["unshare", "--user", "--net", "--pid", "--fork", "--kill-child", "--"]


def _prlimit_prefix(limits: Limits) -> list[str]:
    return [
        "prlimit", f"--as={limits.memory_bytes}", f"--cpu={limits.cpu_s}", f"--nproc={limits.max_processes}",
        f"--fsize={limits.max_file_bytes}", f"--nofile={limits.max_open_files}", "--core=0", "--",
    ]


def _live_processes(uids: range) -> list[int]:
    """Live processes whose real uid is in `uids`; zombies are dead already (no memory, no CPU) and
    are left to their reaper."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if int(fields["Uid"].split()[1]) in uids and not fields["State"].strip().startswith(("Z", "X")):
            pids.append(int(entry))
    return pids


def _processes_of_uid(uid: int) -> list[int]:
    return _live_processes(range(uid, uid + 1))


def sandbox_processes() -> list[int]:
    """Live processes of any sandbox uid (the probe's included): empty when the machine is clean."""
    return _live_processes(range(UID_BASE, UID_BASE + UID_COUNT + 1))


def kill_uid(uid: int, rounds: int = 20) -> list[int]:
    """SIGKILL every process running as `uid` until none is left; returns those that survived."""
    for _ in range(rounds):
        pids = _processes_of_uid(uid)
        if not pids:
            return []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
    return _processes_of_uid(uid)


def _read_capped(path: Path, cap: int) -> str:
    with open(path, "rb") as f:
        return f.read(cap).decode(errors="replace")


def run_python(source: str, stdin: str = "", limits: Limits = Limits(), python: str | None = None,
               files: dict[str, str] | None = None) -> RunResult:
    """Run `source` as a Python program with `stdin`, contained as the module docstring says.

    `files` are extra files written beside the program (e.g. a test driver's input).
    """
    mode = isolation_mode()
    python = python or default_python()
    with _lease_uid() as uid, tempfile.TemporaryDirectory(prefix="infir-sbx-") as host_dir:
        if uid is not None:
            kill_uid(uid)  # leftovers of a holder that crashed before its own sweep
        os.chmod(host_dir, 0o711)  # the sandbox uid must reach box/ but not list its neighbours
        workdir = Path(host_dir) / "box"  # the only place the program may write
        workdir.mkdir()
        (workdir / "main.py").write_text(source)
        for name, text in (files or {}).items():
            (workdir / name).write_text(text)
        (Path(host_dir) / "stdin").write_text(stdin)
        if uid is not None:
            for path in [workdir, *workdir.iterdir()]:
                os.chown(path, uid, uid)
        if mode == "bwrap":
            argv = _prlimit_prefix(limits) + _bwrap_prefix(str(workdir)) + [python, "-I", "main.py"]
            cwd = None
        else:
            isolate = _unshare_prefix() if mode == "unshare" else []
            argv = _prlimit_prefix(limits) + isolate + [python, "-I", "main.py"]
            cwd = workdir
        out_path, err_path = Path(host_dir) / "stdout", Path(host_dir) / "stderr"
        timed_out = False
        with open(Path(host_dir) / "stdin", "rb") as fin, open(out_path, "wb") as fout, open(err_path, "wb") as ferr:
            proc = subprocess.Popen(
                argv, stdin=fin, stdout=fout, stderr=ferr, cwd=cwd, user=uid, group=uid,
                extra_groups=[] if uid is not None else None, start_new_session=True,
                env=None if mode == "bwrap" else _child_env(workdir),
            )
            try:
                returncode = proc.wait(timeout=limits.wall_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                returncode = -signal.SIGKILL
            finally:
                _kill_group(proc)
                if uid is not None:
                    survivors = kill_uid(uid)
                    if survivors:
                        raise RuntimeError(f"sandbox: processes {survivors} of uid {uid} survived SIGKILL")
        cap = limits.max_file_bytes
        return RunResult(returncode, _read_capped(out_path, cap), _read_capped(err_path, cap), timed_out, mode)


_SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"


def default_python() -> str:
    """The system interpreter: the harness's own may live where the sandbox uid cannot read (/root)."""
    return shutil.which("python3", path=_SANDBOX_PATH) or sys.executable


def _child_env(workdir: Path) -> dict[str, str]:
    return {"PATH": _SANDBOX_PATH, "HOME": str(workdir), "TMPDIR": str(workdir),
            "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
