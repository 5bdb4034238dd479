"""Containment of generated programs: each attack is graded as a failure, leaves no process and no
file behind, and the harness keeps working. Every attack would print the expected "42" if it got
through, so a pass here can only come from containment."""
import os
import socket
import time
import uuid
from pathlib import Path

import pytest

from infir.eval.code_tests import CodeTask, TestCase, grade_code
from infir.eval.sandbox import Limits, isolation_mode, run_python, sandbox_processes

LIMITS = Limits(wall_s=4.0, cpu_s=2, memory_bytes=1 << 30, max_processes=32)
TASK = CodeTask(tests=(TestCase(input="", output="42\n"),), style="stdin", limits=LIMITS)


def respond(code: str) -> str:
    return f"<think>plan</think>\n```python\n{code}\n```"


@pytest.fixture(autouse=True)
def machine_stays_clean():
    yield
    assert os.geteuid() == 0, "the containment tests run as root (CI does): sandbox uids need it"
    assert sandbox_processes() == []
    verdict, reason = grade_code(respond("print(42)"), TASK)  # the harness still works
    assert verdict.correct, reason


def test_isolation_is_the_strong_kind():
    # CI installs bubblewrap; the rlimits-only fallback would leave the network open.
    assert isolation_mode() == "bwrap"


def test_well_behaved_program_passes_and_reads_stdin():
    task = CodeTask(tests=(TestCase("3 4\n", "7\n"), TestCase("10 -2\n", "8\n")), style="stdin", limits=LIMITS)
    verdict, reason = grade_code(respond("a, b = map(int, input().split())\nprint(a + b)"), task)
    assert verdict.correct, reason


def test_fork_bomb_is_contained():
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\nprint(42)"
    start = time.monotonic()
    verdict, reason = grade_code(respond(bomb), TASK)
    assert not verdict.correct
    assert "time limit" in reason
    assert time.monotonic() - start < LIMITS.wall_s + 5


def test_process_limit_stops_mass_forking():
    spawn = "import os, time\nfor _ in range(200):\n    if os.fork() == 0:\n        time.sleep(60)\nprint(42)"
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
    assert "time limit" not in reason and reason.startswith("test 0: exit"), reason
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


@pytest.mark.parametrize("where", ["tmp", "repo", "home"])
def test_writing_outside_its_directory_fails(tmp_path, where):
    target = {"tmp": tmp_path / "escaped.txt", "repo": Path.cwd() / f"escaped-{uuid.uuid4().hex}.txt",
              "home": Path.home() / f"escaped-{uuid.uuid4().hex}.txt"}[where]
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
    import shutil

    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "bwrap" else real_which(name, *a, **k))
    with pytest.warns(RuntimeWarning, match="apt-get install -y bubblewrap"):
        mode = isolation_mode.__wrapped__()
    assert mode in ("unshare", "rlimits")


def test_unshare_fallback_still_contains(monkeypatch, tmp_path):
    import infir.eval.sandbox as sandbox

    monkeypatch.setattr(sandbox, "isolation_mode", lambda: "unshare")
    assert run_python("print(input())", "hi\n", LIMITS).stdout == "hi\n"
    assert not run_python("x = bytearray(10 * 1024 ** 3)", limits=LIMITS).ok
    assert run_python("while True:\n    pass", limits=LIMITS).returncode != 0
    target = tmp_path / "escaped.txt"
    assert not run_python(f"open({str(target)!r}, 'w').write('x')", limits=LIMITS).ok or not target.exists()
    assert not target.exists()
    net = run_python("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)", limits=LIMITS)
    assert not net.ok


def test_parallel_runs_get_their_own_uids():
    from concurrent.futures import ThreadPoolExecutor

    code = "import os, time\ntime.sleep(0.5)\nprint(os.getuid())"
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: run_python(code, limits=LIMITS), range(4)))
    assert all(r.ok for r in results), [r.stderr for r in results]
    uids = {int(r.stdout) for r in results}
    assert len(uids) == 4 and 0 not in uids  # so one run's limits and final sweep never touch another


def test_detached_background_process_does_not_outlive_the_run():
    code = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(600)\n"
            "    os._exit(0)\nprint(42)")
    verdict, reason = grade_code(respond(code), TASK)
    assert verdict.correct, reason  # the answer is right; what matters is the sweep checked by the fixture
