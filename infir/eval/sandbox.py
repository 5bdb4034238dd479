"""Run untrusted generated programs in a contained subprocess.

Layers, outermost first (each catches what the one inside may miss):

1. A dedicated unprivileged host uid per run when we are root (`_lease_uid`): the kernel never applies
   the process limit to host uid 0, not even inside a user namespace, so root hands each run to a uid
   of its own; that uid also lets us sweep every process of the run at the end.
2. bubblewrap: a new user namespace in which the program is uid and gid SANDBOX_UID and may make no
   further user namespace; new network (no network at all), pid, ipc, uts and cgroup namespaces. Its
   file system holds only the interpreter (its prefixes and the directories of the shared libraries
   the dynamic loader resolves for it, read-only), a fresh /proc, a read-only /dev and a private tmpfs
   at /tmp, capped at `Limits.max_disk_bytes`, which holds the program and is the only writable place:
   no host socket, no /home, /root, /run, /var, no project or benchmark file. Where bwrap is missing
   or cannot create namespaces we fall back to `unshare` for the network/pid namespaces and warn once,
   because the file system is then protected only by the uid, and the disk only per file.
3. A launcher inside the namespaces sets the resource limits, then becomes the program: address space
   (a 10 GB allocation fails), CPU seconds (a busy loop gets SIGXCPU/SIGKILL), process count (fork
   bomb), file size, open files, no core dumps. A process of its own, because a `preexec_fn` is unsafe
   when the grader runs in threads. The process count is set there and not before the sandbox starts
   because the kernel counts RLIMIT_NPROC per (user namespace, host uid): set inside a fresh user
   namespace it counts only the run's own processes, set outside it counts every process of the
   invoking user, who may already have that many, so the sandbox could not even start. (A pids cgroup
   would count the same way, but cgroup v1 hosts and unprivileged users have none to create.)
4. Wall-clock timeout in the parent, then SIGKILL to the sandbox's init, whose exit the kernel
   completes only after every process of its pid namespace is gone, and the uid sweep.

A run whose launcher did not report that the program started raises SandboxError: a sandbox that
fails is an infrastructure error that stops the evaluation, never a wrong answer.

stdout/stderr go to files the sandbox cannot see (capped by RLIMIT_FSIZE) so a program that prints
forever cannot fill the harness's memory.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import itertools
import json
import os
import re
import select
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
SANDBOX_UID = 1000  # the program's uid and gid inside its user namespace (no account there has a name)
_BOX = "/tmp"  # the program's directory inside bwrap: the private, size-capped tmpfs
_REAP_TIMEOUT_S = 10.0  # how long a killed sandbox may take to be gone before that is an error


class SandboxError(RuntimeError):
    """The sandbox could not start or clean up: an infrastructure failure, never a verdict on a program."""


@dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0
    cpu_s: int = 10
    memory_bytes: int = 2 << 30
    max_processes: int = 64
    max_file_bytes: int = 64 << 20
    max_open_files: int = 256
    max_disk_bytes: int = 128 << 20  # everything the program writes, all files together

    def __post_init__(self):
        for name in ("wall_s", "cpu_s", "memory_bytes", "max_processes", "max_file_bytes", "max_open_files",
                     "max_disk_bytes"):
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
    raise SandboxError(f"sandbox: all {UID_COUNT} sandbox uids are busy; lower grading.workers")


@functools.lru_cache(maxsize=None)
def isolation_mode() -> str:
    """The strongest isolation that works on this machine (probed once, by running a program in it)."""
    reason = _probe_failure("bwrap") if shutil.which("bwrap") else "bwrap is not installed"
    if reason is None:
        return "bwrap"
    mode = "unshare" if _probe_failure("unshare") is None else "rlimits"
    namespaces = "no network or pid namespaces" if mode == "rlimits" else "network and pid namespaces"
    files = "protected only by a dedicated uid" if _is_root() else "NOT protected (run as root)"
    warnings.warn(
        f"sandbox: bubblewrap unusable ({reason}); falling back to {mode}: {namespaces}, file system {files}, "
        "no disk cap. Fix: `apt-get install -y bubblewrap` on a host that allows user namespaces.",
        RuntimeWarning,
        stacklevel=2,
    )
    return mode


def _probe_failure(mode: str) -> str | None:
    """Why `mode` cannot run a program here, or None when it can."""
    try:
        result = _run(mode, "pass", "", Limits(), default_python(), {})
    except SandboxError as e:
        return str(e)
    return None if result.ok else result.stderr.strip() or f"exit {result.returncode}"


def _bwrap_prefix(python: str, limits: Limits, files: dict[str, int], info_fd: int) -> list[str]:
    """bwrap up to `--`; `files` are the program's files (name -> open fd) copied into its directory,
    `info_fd` is where bwrap writes its init's pid."""
    copies = [arg for name, fd in files.items() for arg in ("--file", str(fd), f"{_BOX}/{name}")]
    return [
        # --disable-userns: in a user namespace of its own the program could mount a tmpfs of its own,
        # without the disk cap
        "bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--uid", str(SANDBOX_UID),
        "--gid", str(SANDBOX_UID), "--die-with-parent", "--new-session", "--info-fd", str(info_fd),
        # the box first: an interpreter that lives under /tmp on the host is then mounted over it
        "--size", str(limits.max_disk_bytes), "--tmpfs", _BOX, *_interpreter_mounts(python),
        "--dev", "/dev", "--proc", "/proc", *copies,
        # bwrap's root and /dev are tmpfs without a size cap: read-only, /tmp stays the only writable place
        "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", _BOX,
        "--clearenv", "--setenv", "PATH", _SANDBOX_PATH, "--setenv", "HOME", _BOX,
        "--setenv", "TMPDIR", _BOX, "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
        "--setenv", "OMP_NUM_THREADS", "1", "--setenv", "OPENBLAS_NUM_THREADS", "1", "--",
    ]


def _unshare_prefix() -> list[str]:
    return ["unshare", "--user", "--net", "--pid", "--fork", "--kill-child", "--"]


_INTERPRETER_QUERY = """\
import json, sys
print(json.dumps({"executable": sys.executable,
                  "prefixes": [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix],
                  "dynload": [p for p in sys.path if p.endswith("lib-dynload")]}))
"""


@functools.lru_cache(maxsize=None)
def _interpreter_mounts(python: str) -> tuple[str, ...]:
    """bwrap arguments that show `python` at its own path with what it needs and nothing else of the
    host: its prefixes and the directories of the shared libraries the dynamic loader resolves for it
    and its extension modules (read-only), symlinks on the way recreated, and the loader's cache."""
    try:
        query = subprocess.run([python, "-I", "-c", _INTERPRETER_QUERY], capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise SandboxError(f"sandbox: cannot run the interpreter {python}: {e}") from e
    if query.returncode != 0:
        raise SandboxError(f"sandbox: the interpreter {python} failed: {query.stderr.strip()[-500:]}")
    info = json.loads(query.stdout)
    binaries = [os.path.realpath(info["executable"])]
    binaries += [str(p) for d in info["dynload"] for p in sorted(Path(d).glob("*.so"))]
    files = [info["executable"], python, *_shared_libraries(binaries)]
    homes = [os.path.dirname(os.path.realpath(f)) for f in files]  # whole directories: libraries dlopen others
    return tuple(_read_only_view([*info["prefixes"], *homes, *files, "/etc/ld.so.cache"]))


def _shared_libraries(binaries: list[str]) -> list[str]:
    """The paths at which the dynamic loader finds the libraries `binaries` need, the loader included."""
    try:
        ldd = subprocess.run(["ldd", *binaries], capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise SandboxError(f"sandbox: cannot list the interpreter's shared libraries with ldd: {e}") from e
    return sorted(set(re.findall(r"(/\S+) \(0x[0-9a-f]+\)", ldd.stdout)))


def _resolve(path: str) -> tuple[str, dict[str, str]]:
    """`path` with every symlink resolved, and the symlinks met on the way ({link: target})."""
    links, done, todo, hops = {}, "/", list(Path(path).parts[1:]), 0
    while todo:
        candidate = os.path.join(done, todo.pop(0))
        if os.path.islink(candidate):
            hops += 1
            if hops > 40:  # the kernel's own limit (ELOOP)
                raise SandboxError(f"sandbox: too many levels of symlinks in {path}")
            links[candidate] = os.readlink(candidate)
            resolved = os.path.normpath(os.path.join(done, links[candidate]))
            done, todo = "/", list(Path(resolved).parts[1:]) + todo
        else:
            done = candidate
    return done, links


def _read_only_view(paths: list[str]) -> list[str]:
    """bwrap arguments binding the existing `paths` read-only where they are, with the symlinks that
    lead to them; nothing already visible through another bound directory twice."""
    sources, links = set(), {}
    for path in filter(os.path.exists, paths):
        real, met = _resolve(path)
        sources.add(real)
        links.update(met)
    binds = sorted(s for s in sources if not _under(s, sources))
    args = [arg for source in binds for arg in ("--ro-bind", source, source)]
    links = {link: target for link, target in links.items() if not _under(link, binds)}
    return args + [arg for link in sorted(links) for arg in ("--symlink", links[link], link)]


def _under(path: str, roots) -> bool:
    """Whether `path` lies strictly inside one of `roots`."""
    return any(path != root and path.startswith(root.rstrip("/") + "/") for root in roots)


# Runs inside every isolation, before the program: sets the limits there (the module docstring says
# why the process count must be set inside the user namespace), tells the parent on the fd named first
# that the sandbox started, closes every inherited fd, and becomes the program.
_LAUNCHER = """\
import os, resource, sys
for spec in sys.argv[2:]:
    name, value = spec.split("=")
    limit = getattr(resource, "RLIMIT_" + name)
    hard = resource.getrlimit(limit)[1]
    value = int(value) if hard == resource.RLIM_INFINITY else min(int(value), hard)
    resource.setrlimit(limit, (value, value))
os.write(int(sys.argv[1]), b"1")
os.closerange(3, 1 << 20)
os.execv(sys.executable, [sys.executable, "-I", "main.py"])
"""


def _launcher(python: str, limits: Limits, started_fd: int) -> list[str]:
    specs = [f"AS={limits.memory_bytes}", f"CPU={limits.cpu_s}", f"NPROC={limits.max_processes}",
             f"FSIZE={limits.max_file_bytes}", f"NOFILE={limits.max_open_files}", "CORE=0"]
    return [python, "-I", "-c", _LAUNCHER, str(started_fd), *specs]


def _live_processes(uids: range) -> list[int]:
    """Live processes whose uid is in `uids`."""
    return [pid for pid, fields in _process_table() if int(fields["Uid"].split()[1]) in uids]


def _process_table() -> list[tuple[int, dict[str, str]]]:
    """(pid, /proc/<pid>/status fields) of every live process; zombies are dead already (no memory, no
    CPU) and are left to their reaper."""
    table = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = _status(int(entry))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if not fields["State"].strip().startswith(("Z", "X")):
            table.append((int(entry), fields))
    return table


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.split(":", 1) for line in f if ":" in line)


def _processes_of_uid(uid: int) -> list[int]:
    return _live_processes(range(uid, uid + 1))


def sandbox_processes() -> list[int]:
    """Live processes of any sandbox run: empty when the machine is clean. As root, those of a sandbox
    uid; otherwise our own processes in a pid namespace below ours."""
    if _is_root():
        return _live_processes(range(UID_BASE, UID_BASE + UID_COUNT))
    depth = len(_status(os.getpid())["NSpid"].split())
    return [pid for pid, fields in _process_table()
            if int(fields["Uid"].split()[1]) == os.getuid() and len(fields["NSpid"].split()) > depth]


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

    `files` are extra files written beside the program (e.g. a test driver's input). Raises
    SandboxError when the sandbox cannot start the program or cannot remove it afterwards.
    """
    return _run(isolation_mode(), source, stdin, limits, python or default_python(), files or {})


def _run(mode: str, source: str, stdin: str, limits: Limits, python: str, files: dict[str, str]) -> RunResult:
    with _lease_uid() as uid, tempfile.TemporaryDirectory(prefix="infir-sbx-") as host_dir:
        if uid is not None:
            kill_uid(uid)  # leftovers of a holder that crashed before its own sweep
        workdir = _write_program(Path(host_dir), source, stdin, files, uid)
        returncode, timed_out = _contain(mode, python, limits, workdir, uid)
        out, err = (_read_capped(Path(host_dir) / name, limits.max_file_bytes) for name in ("stdout", "stderr"))
        return RunResult(returncode, out, err, timed_out, mode)


def _write_program(host_dir: Path, source: str, stdin: str, files: dict[str, str], uid: int | None) -> Path:
    """The program's directory, `host_dir`/box, with main.py and `files`; stdin beside it. The fallback
    isolations run the program in that directory, so the sandbox uid owns it."""
    os.chmod(host_dir, 0o711)  # the sandbox uid must reach box/ but not list its neighbours
    workdir = host_dir / "box"
    workdir.mkdir()
    (workdir / "main.py").write_text(source)
    for name, text in files.items():
        (workdir / name).write_text(text)
    (host_dir / "stdin").write_text(stdin)
    if uid is not None:
        for path in [workdir, *workdir.iterdir()]:
            os.chown(path, uid, uid)
    return workdir


def _contain(mode: str, python: str, limits: Limits, workdir: Path, uid: int | None) -> tuple[int, bool]:
    """(returncode, timed_out) of the program in `workdir` under `mode`; nothing of it is left running
    when this returns. Raises SandboxError when the program did not start."""
    started_r, started_w = os.pipe()
    with _closing([started_r]):
        deadline = time.monotonic() + limits.wall_s
        with _closing([started_w]):  # the sandbox holds its own copy; ours would hide the launcher's exit
            proc, init = _start(mode, python, limits, workdir, uid, started_w, deadline)
        timed_out = False
        try:
            returncode = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out, returncode = True, -signal.SIGKILL
        finally:
            _end(proc, init, uid)
        if not _started(started_r):
            stderr = _read_capped(workdir.parent / "stderr", 4096).strip()
            raise SandboxError(f"sandbox ({mode}) did not start the program: {stderr or f'exit {returncode}'}")
        return returncode, timed_out


def _start(mode: str, python: str, limits: Limits, workdir: Path, uid: int | None, started_w: int,
           deadline: float) -> tuple[subprocess.Popen, int | None]:
    """The running sandbox, and a pidfd of its init where bwrap made one."""
    launcher = _launcher(python, limits, started_w)
    if mode != "bwrap":
        isolate = _unshare_prefix() if mode == "unshare" else []
        return _spawn(isolate + launcher, [started_w], workdir, uid, cwd=workdir, env=_child_env(workdir)), None
    info_r, info_w = os.pipe()
    with _closing([info_r]):
        passed = [info_w]  # the sandbox gets copies; ours close once it started, so the info pipe ends
        with _closing(passed):
            program = {}
            for path in sorted(workdir.iterdir()):
                program[path.name] = os.open(path, os.O_RDONLY)
                passed.append(program[path.name])
            argv = _bwrap_prefix(python, limits, program, info_w) + launcher
            proc = _spawn(argv, [started_w, *passed], workdir, uid, cwd=None, env=None)
        return proc, _init_pidfd(info_r, deadline)


@contextlib.contextmanager
def _closing(fds: list[int]):
    """Close `fds`, as the list holds them when the block ends."""
    try:
        yield
    finally:
        for fd in fds:
            os.close(fd)


def _spawn(argv: list[str], pass_fds: list[int], workdir: Path, uid: int | None, cwd: Path | None,
           env: dict[str, str] | None) -> subprocess.Popen:
    """Start `argv` as `uid` in a session of its own, on the run's stdin/stdout/stderr files, with
    copies of `pass_fds`. Failing to start is a SandboxError."""
    host_dir = workdir.parent
    try:
        with open(host_dir / "stdin", "rb") as fin, open(host_dir / "stdout", "wb") as fout, \
                open(host_dir / "stderr", "wb") as ferr:
            return subprocess.Popen(
                argv, stdin=fin, stdout=fout, stderr=ferr, pass_fds=pass_fds, cwd=cwd, env=env, user=uid,
                group=uid, extra_groups=[] if uid is not None else None, start_new_session=True,
            )
    except OSError as e:
        raise SandboxError(f"sandbox: cannot start {argv[0]}: {e}") from e


def _init_pidfd(info_r: int, deadline: float) -> int | None:
    """A pidfd of the sandbox's init, read from bwrap's info fd; None where bwrap started none or it is
    gone already (its pid namespace is then empty)."""
    text = b""
    while select.select([info_r], [], [], max(0.0, deadline - time.monotonic()))[0]:
        chunk = os.read(info_r, 4096)
        if not chunk:
            break
        text += chunk
    if not text:
        return None
    info, _ = json.JSONDecoder().raw_decode(text.decode())
    try:
        pidfd = os.pidfd_open(info["child-pid"])
        same = os.readlink(f"/proc/{info['child-pid']}/ns/pid") == f"pid:[{info['pid-namespace']}]"
    except OSError:  # gone, and its pid perhaps reused: nothing of the sandbox is left to wait for
        return None
    if not same:
        os.close(pidfd)
        return None
    return pidfd


def _end(proc: subprocess.Popen, init: int | None, uid: int | None) -> None:
    """Kill every process of the run and wait until they are gone."""
    _kill_group(proc)
    if init is not None:
        _kill_init(init)
    if uid is not None:
        survivors = kill_uid(uid)
        if survivors:
            raise SandboxError(f"sandbox: processes {survivors} of uid {uid} survived SIGKILL")


def _kill_init(pidfd: int) -> None:
    """SIGKILL the sandbox's init and wait for its exit, which the kernel completes only once every
    other process of its pid namespace is gone."""
    try:
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        gone = select.select([pidfd], [], [], _REAP_TIMEOUT_S)[0]
    finally:
        os.close(pidfd)
    if not gone:
        raise SandboxError(f"sandbox: the run's pid namespace outlived its init's SIGKILL by {_REAP_TIMEOUT_S} s")


def _started(started_r: int) -> bool:
    """Whether the launcher reported that the program started (everything that could write is dead)."""
    os.set_blocking(started_r, False)
    try:
        return os.read(started_r, 1) == b"1"
    except BlockingIOError:
        return False


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
