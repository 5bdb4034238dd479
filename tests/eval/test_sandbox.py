"""Containment of generated programs: each attack is graded as a failure, leaves no process and no
file behind, and the harness keeps working. Every attack would print the expected "42" if it got
through, so a pass here can only come from containment. CI runs these as root, and
`test_sandbox_tests_pass_as_an_unprivileged_user` runs them again as nobody."""
import os
import pwd
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import infir.eval.sandbox as sandbox
from infir.eval.backends import Completion
from infir.eval.benchmarks import Benchmark, Problem
from infir.eval.code_tests import CodeTask, TestCase, grade_code
from infir.eval.runner import grade_problem
from infir.eval.sandbox import SANDBOX_UID, Limits, SandboxError, isolation_mode, run_python, sandbox_processes

LIMITS = Limits(wall_s=4.0, cpu_s=2, memory_bytes=1 << 30, max_processes=32)
TASK = CodeTask(tests=(TestCase(input="", output="42\n"),), style="stdin", limits=LIMITS)
CHECKOUT = Path(__file__).resolve().parents[2]
# Forks children that stay alive until the cap refuses one, then prints how many it got.
FORK_TO_THE_CAP = ("import os, time\nn = 0\ntry:\n    while n < 200:\n        if os.fork() == 0:\n"
                   "            time.sleep(60)\n            os._exit(0)\n        n += 1\nexcept OSError:\n    pass\n"
                   "time.sleep(0.5)\nprint(n)")


def respond(code: str) -> str:
    return f"<think>plan</think>\n```python\n{code}\n```"


@pytest.fixture(autouse=True)
def machine_stays_clean():
    yield
    assert sandbox_processes() == []
    verdict, reason = grade_code(respond("print(42)"), TASK)  # the harness still works
    assert verdict.correct, reason


@pytest.fixture
def host_dir():
    """A directory every user can reach, in a place the program could reach before it had its own view
    of the file system (/tmp was hidden already, /var/tmp was not)."""
    path = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="infir-sbx-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def test_isolation_is_the_strong_kind():
    # CI installs bubblewrap; the rlimits-only fallback would leave the network open.
    assert isolation_mode() == "bwrap"


def test_well_behaved_program_passes_and_reads_stdin():
    task = CodeTask(tests=(TestCase("3 4\n", "7\n"), TestCase("10 -2\n", "8\n")), style="stdin", limits=LIMITS)
    verdict, reason = grade_code(respond("a, b = map(int, input().split())\nprint(a + b)"), task)
    assert verdict.correct, reason


def test_fork_bomb_is_contained():
    # posix.fork: the harness switches os.fork off, which is no defence; the sandbox is
    bomb = "import posix\nwhile True:\n    try:\n        posix.fork()\n    except OSError:\n        pass\nprint(42)"
    start = time.monotonic()
    verdict, reason = grade_code(respond(bomb), TASK)
    assert not verdict.correct
    assert "time limit" in reason
    assert time.monotonic() - start < LIMITS.wall_s + 5


def test_process_limit_stops_mass_forking():
    spawn = "import posix, time\nfor _ in range(200):\n    if posix.fork() == 0:\n        time.sleep(60)\nprint(42)"
    verdict, reason = grade_code(respond(spawn), TASK)
    assert not verdict.correct
    assert "Resource temporarily unavailable" in reason or "BlockingIOError" in reason, reason


def test_infinite_loop_is_killed_by_cpu_limit():
    # A generous wall clock, so that only the CPU-time limit can end the loop (on a busy machine 1 s
    # of CPU may take several seconds of wall time).
    task = CodeTask(tests=TASK.tests, style="stdin", limits=Limits(wall_s=60.0, cpu_s=1))
    start = time.monotonic()
    verdict, reason = grade_code(respond("while True:\n    pass\nprint(42)"), task)
    assert not verdict.correct
    assert "time limit" not in reason and reason.startswith("exit"), reason
    assert time.monotonic() - start < 60


def test_sleeping_program_is_killed_by_wall_clock():
    verdict, reason = grade_code(respond("import time\ntime.sleep(600)\nprint(42)"), TASK)
    assert not verdict.correct and "time limit" in reason


def test_ten_gigabyte_allocation_fails():
    verdict, reason = grade_code(respond("x = bytearray(10 * 1024 ** 3)\nprint(42)"), TASK)
    assert not verdict.correct
    assert "MemoryError" in reason


def test_network_connection_is_refused():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint(42)"
        verdict, reason = grade_code(respond(code), TASK)
        assert not verdict.correct and "Error" in reason
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing reached the harness's listener
    outside = "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)\nprint(42)"
    verdict, reason = grade_code(respond(outside), TASK)
    assert not verdict.correct and "unreachable" in reason.lower()


def test_host_unix_socket_is_unreachable(host_dir):
    # A world-writable socket, as a Docker or database socket on a GPU host may be.
    path = host_dir / "service.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        path.chmod(0o777)
        listener.listen()
        listener.setblocking(False)
        code = f"import socket\nsocket.socket(socket.AF_UNIX).connect({str(path)!r})\nprint(42)"
        verdict, reason = grade_code(respond(code), TASK)
        assert not verdict.correct and "FileNotFoundError" in reason, reason
        with pytest.raises(BlockingIOError):
            listener.accept()


def test_program_sees_only_the_interpreter(host_dir):
    answers = host_dir / "expected_outputs.jsonl"  # world-readable, as the benchmark files are
    answers.write_text('{"output": "42"}\n')
    answers.chmod(0o644)
    paths = ["/etc/passwd", "/var", "/run", "/home", "/root", str(CHECKOUT), str(answers)]
    code = f"import os\nprint([p for p in {paths!r} if os.path.exists(p)])"
    result = run_python(code, limits=LIMITS)
    assert result.ok and result.stdout == "[]\n", result


def test_program_runs_as_a_uid_of_its_own():
    code = "import os\nprint(os.getuid(), os.getgid(), *open('/proc/self/uid_map').read().split())"
    result = run_python(code, limits=LIMITS)
    uid, gid, inside, _, count = map(int, result.stdout.split())
    assert uid == gid == inside == SANDBOX_UID and count == 1, result  # its user namespace maps that uid alone


def test_invokers_private_file_is_unreadable(host_dir):
    secret = host_dir / ".netrc"  # as in the invoking user's home, mode 0600
    secret.write_text("machine example.com password 42\n")
    secret.chmod(0o600)
    verdict, reason = grade_code(respond(f"print(open({str(secret)!r}).read().split()[-1])"), TASK)
    assert not verdict.correct and "FileNotFoundError" in reason, reason


def test_sandbox_starts_while_the_invoker_runs_many_processes():
    # More processes than the program's cap already run as the invoking user: the cap counts only the
    # program's own, so it still starts and still gets its whole cap.
    others = [subprocess.Popen(["sleep", "60"]) for _ in range(LIMITS.max_processes + 8)]
    try:
        verdict, reason = grade_code(respond("print(42)"), TASK)
        assert verdict.correct, reason
        result = run_python(FORK_TO_THE_CAP, limits=LIMITS)
        assert result.ok and LIMITS.max_processes - 4 <= int(result.stdout) < LIMITS.max_processes, result
    finally:
        for process in others:
            process.kill()
            process.wait()


def test_parallel_runs_each_get_their_own_process_cap():
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: run_python(FORK_TO_THE_CAP, limits=LIMITS), range(4)))
    assert all(r.ok for r in results), [r.stderr for r in results]
    counts = [int(r.stdout) for r in results]
    assert all(LIMITS.max_processes - 4 <= n < LIMITS.max_processes for n in counts), counts


def test_sandbox_that_cannot_start_is_an_error_not_a_verdict():
    assert grade_code(respond("print(42)"), TASK)[0].correct  # the probe has run; only the runs below fail
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    resource.setrlimit(resource.RLIMIT_NPROC, (1, hard))  # the invoking user is at its process limit
    try:
        with pytest.raises(SandboxError, match="Resource temporarily unavailable"):
            grade_code(respond("print(42)"), TASK)
    finally:
        resource.setrlimit(resource.RLIMIT_NPROC, (soft, hard))


def test_sandbox_failure_stops_the_evaluation(monkeypatch, tmp_path):
    isolation_mode()  # probed with the real interpreter
    broken = tmp_path / "python3"
    broken.write_text("#!/bin/sh\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setattr(sandbox, "default_python", lambda: str(broken))
    bench = Benchmark(name="code", grader="code", hf_id="", to_problem=lambda record, seed: None)
    problem = Problem(id="p0", prompt="", code_task=TASK)
    completions = [Completion(respond("print(42)"), num_tokens=5, finish_reason="stop")] * 2
    with ThreadPoolExecutor(2) as pool, pytest.raises(SandboxError):
        grade_problem(bench, problem, "", completions, LIMITS, pool)


def test_disk_use_is_capped():
    # 16 files at the file-size limit: without a total cap that is 16 x max_file_bytes.
    limits = Limits(wall_s=10.0, cpu_s=5, max_file_bytes=16 << 20, max_disk_bytes=32 << 20)
    code = ("import os\nwritten = 0\ntry:\n    for i in range(16):\n"
            "        fd = os.open(f'f{i}', os.O_WRONLY | os.O_CREAT)\n"
            "        for _ in range(16):\n            written += os.write(fd, bytes(1 << 20))\n"
            "except OSError as e:\n    print(written, e.strerror)")
    result = run_python(code, limits=limits)
    written, error = result.stdout.split(" ", 1)
    assert int(written) <= limits.max_disk_bytes and error.strip() == "No space left on device", result


def test_disk_cap_cannot_be_escaped_with_a_tmpfs_of_its_own():
    # A user namespace of its own would let the program mount an uncapped tmpfs.
    code = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nuid, gid = os.getuid(), os.getgid()\n"
            "if libc.unshare(0x10000000 | 0x00020000) != 0:  # CLONE_NEWUSER | CLONE_NEWNS\n"
            "    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))\n"
            "open('/proc/self/setgroups', 'w').write('deny')\n"
            "open('/proc/self/uid_map', 'w').write(f'0 {uid} 1')\nopen('/proc/self/gid_map', 'w').write(f'0 {gid} 1')\n"
            "os.makedirs('own')\n"
            "if libc.mount(b'none', b'own', b'tmpfs', 0, None) != 0:\n"
            "    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))\n"
            "for i in range(4):\n    open(f'own/f{i}', 'wb').write(bytes(8 << 20))\nprint(42)")
    task = CodeTask(tests=TASK.tests, style="stdin", limits=Limits(wall_s=4.0, cpu_s=2, max_disk_bytes=16 << 20))
    verdict, reason = grade_code(respond(code), task)
    assert not verdict.correct and "No space left on device" in reason, reason


@pytest.mark.parametrize("where", ["tmp", "repo", "home", "root", "dev", "shm"])
def test_writing_outside_its_directory_fails(tmp_path, where):
    name = f"escaped-{uuid.uuid4().hex}.txt"
    target = {"tmp": tmp_path / name, "repo": CHECKOUT / name, "home": Path.home() / name,
              "root": Path("/") / name, "dev": Path("/dev") / name, "shm": Path("/dev/shm") / name}[where]
    verdict, reason = grade_code(respond(f"open({str(target)!r}, 'w').write('x')\nprint(42)"), TASK)
    assert not verdict.correct and "Error" in reason
    assert not target.exists()


def test_program_may_write_its_own_directory():
    code = "open('scratch.txt', 'w').write('42')\nprint(open('scratch.txt').read())"
    verdict, reason = grade_code(respond(code), TASK)
    assert verdict.correct, reason


def test_output_flood_is_capped():
    limits = Limits(wall_s=4.0, cpu_s=2, max_file_bytes=1 << 20)
    result = run_python("while True:\n    print('x' * 1000)", limits=limits)
    assert not result.ok
    assert len(result.stdout) <= 1 << 20


def test_fallback_warns_when_bwrap_is_missing(monkeypatch):
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "bwrap" else real_which(name, *a, **k))
    with pytest.warns(RuntimeWarning, match="apt-get install -y bubblewrap"):
        mode = isolation_mode.__wrapped__()
    assert mode in ("unshare", "rlimits")


def test_unshare_fallback_still_contains(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox, "isolation_mode", lambda: "unshare")
    assert run_python("print(input())", "hi\n", LIMITS).stdout == "hi\n"
    assert not run_python("x = bytearray(10 * 1024 ** 3)", limits=LIMITS).ok
    assert run_python("while True:\n    pass", limits=LIMITS).returncode != 0
    if os.geteuid() == 0:  # the fallback guards files only by the dedicated uid, which root alone can lend
        target = tmp_path / "escaped.txt"
        assert not run_python(f"open({str(target)!r}, 'w').write('x')", limits=LIMITS).ok
        assert not target.exists()
    net = run_python("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)", limits=LIMITS)
    assert not net.ok


def test_detached_background_process_does_not_outlive_the_run():
    code = ("import os, posix, time\nif posix.fork() == 0:\n    os.setsid()\n    if posix.fork() == 0:\n        time.sleep(600)\n"
            "    os._exit(0)\nprint(42)")
    verdict, reason = grade_code(respond(code), TASK)
    assert verdict.correct, reason  # the answer is right; what matters is the sweep checked by the fixture


def _nobody() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user `nobody` to run the sandbox tests unprivileged")


def _visible_to_nobody(needed: list[Path]) -> list[str]:
    """A bwrap command (as root: a private mount namespace only) in which root's home, where pyenv and
    a CI clone may live unreadable to other users, is an empty tmpfs with the entries that hold
    `needed` shown again read-only (whole entries, so that the host's modes apply on the way down)."""
    home = Path.home().resolve()
    if home == Path("/"):
        return []
    entries = {home / path.relative_to(home).parts[0] for path in needed if path.is_relative_to(home) and path != home}
    binds = [arg for entry in sorted(entries) for arg in ("--ro-bind", str(entry), str(entry))]
    return ["bwrap", "--dev-bind", "/", "/", "--tmpfs", str(home), *binds,
            "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--"]


@pytest.mark.slow
def test_sandbox_tests_pass_as_an_unprivileged_user():
    if os.geteuid() != 0:
        pytest.skip("this run is the unprivileged one")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed: cannot run the tests as nobody")
    nobody = _nobody()
    needed = [Path(p).resolve() for p in {sys.prefix, sys.base_prefix, *sys.path} if p and Path(p).exists()]
    scratch = Path(tempfile.mkdtemp(prefix="infir-sbx-nobody-"))  # pytest's tmp_path and HOME for nobody
    os.chown(scratch, nobody.pw_uid, nobody.pw_gid)
    try:
        argv = _visible_to_nobody(sorted({*needed, CHECKOUT})) + [
            "setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups", "--inh-caps=-all",
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={scratch}/pytest",
            "-k", "not unprivileged", str(Path(__file__).resolve())]
        env = {**os.environ, "PYTHONPATH": str(CHECKOUT), "HOME": str(scratch)}
        result = subprocess.run(argv, cwd=CHECKOUT, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    finally:
        shutil.rmtree(scratch)
