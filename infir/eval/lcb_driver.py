"""LiveCodeBench's test harness, as EvalScope 0.17 runs it, made to run inside infir's sandbox.

This file is not imported by infir: `code_tests` sends its source into the sandbox as the program, with
the solution (solution.py) and the tests (tests.json) beside it. It keeps the harness's semantics,
since InfiR2's LiveCodeBench scores come from it:
- every test of a sample runs in one process, in order, and the first failure ends the sample;
- a stdin program runs as the body of a function (its imports at module level, a final
  `if __name__ == '__main__':` unwrapped) after a prelude of star imports (math, collections, itertools,
  ...); sys.stdin is a StringIO of the input and `open` a mock reading it, stdout is captured, SystemExit
  ends the test normally. So `sys.stdin.buffer` and `global` names fail, as they do there;
- a functional solution gets the same prelude; `Solution()` is called when the source says
  `class Solution`, each input line is one JSON argument, and the result (a tuple read as a list) must
  equal the JSON-decoded output;
- stdout matches when its stripped lines equal the expected ones, line by line exactly or as Decimal
  numbers; each test has an alarm of `timeout` seconds.
It prints one line, RESULT_TAG + JSON {"passed": bool, "reason": str}, last on the real stdout.
"""
import ast
import builtins
import io
import json
import signal
import sys
from decimal import Decimal
from unittest import mock

RESULT_TAG = "@@infir-lcb-result@@"
_STAR = ["string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random", "statistics",
         "itertools", "functools", "operator", "io", "sys", "json", "builtins", "typing"]
PRELUDE = ("".join(f"from {m} import *\n" for m in _STAR)
           + "".join(f"import {m}\n" for m in _STAR[:-2]) + "sys.setrecursionlimit(50000)\n")
# What the harness switches off before running a program (its "reliability guard"): calling one of
# them fails the test there, so it does here.
_DISABLED = {"os": ["kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid", "fork",
                    "forkpty", "killpg", "rename", "renames", "truncate", "replace", "unlink", "fchmod", "fchown",
                    "chmod", "chown", "chroot", "lchflags", "lchmod", "lchown", "getcwd", "chdir"],
             "shutil": ["rmtree", "move", "chown"], "subprocess": ["Popen"]}


class TimeLimit(Exception):
    pass


def _alarm(signum, frame):
    raise TimeLimit


def _guard() -> None:
    import importlib
    import os

    os.environ["OMP_NUM_THREADS"] = "1"
    for module, names in _DISABLED.items():
        for name in names:
            setattr(importlib.import_module(module), name, None)
    builtins.quit = None
    builtins.help = None
    for module in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
        sys.modules[module] = None


def _unwrap_main(code: str) -> str:
    try:
        tree = ast.parse(code)
        last = tree.body[-1]
        if isinstance(last, ast.If) and ast.unparse(last.test).strip() == "__name__ == '__main__'":
            return ast.unparse(tree.body[:-1]) + "\n" + ast.unparse(last.body)
    except Exception:  # unparsable code is left to fail when it runs
        pass
    return code


def _as_function(code: str) -> str:
    """Imports stay at module level; every other statement becomes the body of wrapped_function."""
    try:
        tree = ast.parse(code)
        imports = [s for s in tree.body if isinstance(s, (ast.Import, ast.ImportFrom))]
        body = [s for s in tree.body if not isinstance(s, (ast.Import, ast.ImportFrom))]
        function = ast.FunctionDef(name="wrapped_function", args=ast.arguments(
            posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]), body=body, decorator_list=[], lineno=-1)
        return PRELUDE + "\n" + ast.unparse(imports) + "\n" + ast.unparse(function)
    except Exception:  # the harness runs unparsable code as it is (and it fails)
        return code


def _load(code: str, timeout: int):
    """The module `code` defines, or an instance of its Solution class when it names one."""
    signal.alarm(timeout)
    try:
        namespace = {"__name__": "tmp_sol"}
        exec(code, namespace)
        return namespace["Solution"]() if "class Solution" in code else namespace
    finally:
        signal.alarm(0)


def _member(loaded, name: str):
    found = loaded.get(name) if isinstance(loaded, dict) else getattr(loaded, name, None)
    if found is None:
        raise LookupError(f"the program defines no {name}")
    return found


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().split("\n")]


def stdout_matches(got: str, expected: str) -> bool:
    got_lines, want_lines = _lines(got), _lines(expected)
    if len(got_lines) != len(want_lines):
        return False
    for g, w in zip(got_lines, want_lines):
        if g == w:
            continue
        try:
            if [Decimal(t) for t in g.split()] != [Decimal(t) for t in w.split()]:
                return False
        except Exception:  # a token that is not a number: the lines differ
            return False
    return True


def _run_stdin(function, stdin: str) -> str:
    captured = io.StringIO()
    real_stdout = sys.stdout
    with mock.patch("builtins.open", mock.mock_open(read_data=stdin)), mock.patch("sys.stdin", io.StringIO(stdin)):
        sys.stdout = captured
        try:
            function()
        except SystemExit:
            pass
        finally:
            sys.stdout = real_stdout
    return captured.getvalue()


def _each_test(spec: dict, inputs: list, expected: list, call, matches) -> tuple[bool, str]:
    """Run `call(input)` for each test under the per-test alarm; stop at the first failure."""
    for i, (given, want) in enumerate(zip(inputs, expected)):
        signal.alarm(spec["timeout"])
        try:
            got = call(given)
        except TimeLimit:
            return False, f"test {i}: time limit exceeded"
        except Exception as e:
            return False, f"test {i}: {type(e).__name__}: {e}"[:300]
        finally:
            signal.alarm(0)
        if not matches(got, want):
            return False, f"test {i}: wrong answer"
    return True, f"passed {len(inputs)} tests"


def run_stdin_tests(code: str, spec: dict) -> tuple[bool, str]:
    function = _member(_load(_as_function(_unwrap_main(code)), spec["timeout"]), "wrapped_function")
    return _each_test(spec, spec["inputs"], spec["outputs"], lambda stdin: _run_stdin(function, stdin), stdout_matches)


def run_functional_tests(code: str, spec: dict) -> tuple[bool, str]:
    method = _member(_load(PRELUDE + "\n\n" + code, spec["timeout"]), spec["fn_name"])
    arguments = [[json.loads(line) for line in stdin.split("\n")] for stdin in spec["inputs"]]
    expected = [json.loads(output) for output in spec["outputs"]]
    return _each_test(spec, arguments, expected, lambda args: method(*args),
                      lambda got, want: (list(got) if isinstance(got, tuple) else got) == want)


def main() -> None:
    spec = json.loads(open("tests.json").read())
    code = open("solution.py").read()
    real_stdout = sys.stdout
    signal.signal(signal.SIGALRM, _alarm)
    _guard()
    try:
        run = run_functional_tests if spec.get("fn_name") else run_stdin_tests
        passed, reason = run(code, spec)
    except BaseException as e:  # the program failed to load: a syntax error, no Solution, a time limit
        passed, reason = False, f"{type(e).__name__}: {e}"[:300]
    real_stdout.write("\n" + RESULT_TAG + json.dumps({"passed": passed, "reason": reason}) + "\n")
    real_stdout.flush()


if __name__ == "__main__":
    main()
