#!/usr/bin/env python3
"""torchrun with a verdict: when a rank dies, say which one, how, and where its log is, then stop.

    python launch/elastic.py [torchrun options] --log-dir DIR --redirects 3 --tee 3 --no-python CMD ARGS...

It takes torchrun's own arguments (it *is* `torch.distributed.run`, called as a library). torchrun
already stops the whole worker group when one worker exits badly; what it prints then is a long table
that buries the answer. Here the `ChildFailedError` is caught and turned into
- one paragraph on stderr: the rank that failed first, on which host, its exit code or signal, its
  error message (the traceback written to its error file when the program's main is wrapped in
  `torch.distributed.elastic.multiprocessing.errors.record`), its log file and last lines;
- `<log-dir>/failure.json`, the same as data, for schedulers and tests;
- the exit status: the rank's exit code, or 128 + signal number when it was killed (shell convention).

Which failure is the root cause, in this order: a rank killed by a signal other than SIGTERM/SIGINT
(the OOM killer's SIGKILL, a segfault), then a rank that exited with an error, then one stopped by
SIGTERM/SIGINT (what the agent sends the survivors once it has seen a failure); inside a tier the
earliest error wins. The order matters because a dead rank's peers fail too, in their collectives,
and may record their error before the agent notices the dead one.
Only this node's ranks are known here: on a multi-node job, the node that lost a rank names it, and the
other nodes report their own ranks failing in collectives.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
from pathlib import Path

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.run import parse_args, run

TAIL_LINES = 15


def _when(failure: ProcessFailure) -> float:
    # torch records error times in whole seconds; the error file's mtime tells apart errors of one second.
    if os.path.isfile(failure.error_file):
        return os.stat(failure.error_file).st_mtime
    return float(failure.timestamp)


def _tier(failure: ProcessFailure) -> int:
    if failure.exitcode < 0:
        return 2 if -failure.exitcode in (signal.SIGTERM, signal.SIGINT) else 0
    return 1


def root_cause(failures: dict[int, ProcessFailure]) -> int:
    """Global rank of the failure that started it all (see module docstring)."""
    return min(failures, key=lambda r: (_tier(failures[r]), _when(failures[r]), r))


def how_it_died(failure: ProcessFailure) -> str:
    if failure.exitcode < 0:
        return f"killed by signal {-failure.exitcode} ({failure.signal_name()})"
    return f"exited with code {failure.exitcode}"


def exit_status(failure: ProcessFailure) -> int:
    return 128 - failure.exitcode if failure.exitcode < 0 else min(max(failure.exitcode, 1), 255)


def rank_log_dir(log_dir: str | None, local_rank: int) -> Path | None:
    """A local rank's folder (stdout.log, stderr.log) in the newest attempt of `<log_dir>/<run_id>_*/attempt_N/`."""
    if not log_dir:
        return None
    dirs = sorted(Path(log_dir).glob(f"*/attempt_*/{local_rank}"), key=lambda p: p.stat().st_mtime)
    return dirs[-1] if dirs else None


def _tail(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines()[-TAIL_LINES:] if path.is_file() else []


def error_message(failure: ProcessFailure) -> str:
    message = failure.message
    if isinstance(message, dict):  # written by @record: {"message": "...", "extraInfo": {"py_callstack": ...}}
        message = message.get("extraInfo", {}).get("py_callstack") or message.get("message", "")
    return str(message).strip()


def describe(err: ChildFailedError, log_dir: str | None) -> dict:
    rank = root_cause(err.failures)
    failure = err.failures[rank]
    logs = rank_log_dir(log_dir, failure.local_rank)
    return {
        "rank": rank,
        "local_rank": failure.local_rank,
        "host": socket.gethostname(),
        "pid": failure.pid,
        "exitcode": failure.exitcode,
        "signal": failure.signal_name() if failure.exitcode < 0 else None,
        "how": how_it_died(failure),
        "error": error_message(failure),
        "logs": str(logs) if logs else None,
        "stdout_tail": _tail(logs / "stdout.log") if logs else [],
        "stderr_tail": _tail(logs / "stderr.log") if logs else [],
        "other_failed_ranks": {r: how_it_died(f) for r, f in sorted(err.failures.items()) if r != rank},
        "exit_status": exit_status(failure),
    }


def verdict(info: dict) -> str:
    lines = [
        f"infir-launch: rank {info['rank']} (local rank {info['local_rank']} on {info['host']}, pid {info['pid']}) "
        f"{info['how']}; the job was stopped.",
    ]
    if info["error"] and not info["error"].startswith("Signal "):
        lines += ["  its error:", *("    " + line for line in info["error"].splitlines()[-TAIL_LINES:])]
    if info["logs"]:
        lines.append(f"  its logs: {info['logs']}/stdout.log, stderr.log")
        for stream in ("stdout", "stderr"):
            if info[f"{stream}_tail"]:
                lines += [f"  last lines of its {stream}:", *("    " + line for line in info[f"{stream}_tail"])]
    if info["other_failed_ranks"]:
        others = ", ".join(f"rank {r} {how}" for r, how in info["other_failed_ranks"].items())
        lines.append(f"  then: {others}")
    lines.append("  Run the same command again to resume from the last checkpoint.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv if argv is not None else sys.argv[1:])
    try:
        run(args)
    except ChildFailedError as err:
        info = describe(err, args.log_dir)
        print(verdict(info), file=sys.stderr, flush=True)
        if args.log_dir:
            Path(args.log_dir, "failure.json").write_text(json.dumps(info, indent=2) + "\n")
        return info["exit_status"]
    except SignalException as err:  # the launcher itself was told to stop (Ctrl-C, scancel, preemption)
        name = signal.Signals(err.sigval).name
        print(f"infir-launch: the launcher on {socket.gethostname()} received {name}; workers were stopped. "
              "Run the same command again to resume from the last checkpoint.", file=sys.stderr, flush=True)
        return 128 + int(err.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
