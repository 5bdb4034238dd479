"""Keep the Dockerfile honest without a Docker engine: every file it copies, every repo path and command
its instructions and its documented `docker run` lines use, must exist in the repository (and survive
.dockerignore), and its megatron-core pin must be one pyproject.toml allows."""
import fnmatch
import json
import re
import shlex
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SHELL_BUILTINS = {"bash", "sh", "python", "python3", "pip", "cd", "apt-get", "rm", "echo", "sbatch", "env"}


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with comments dropped and backslash continuations joined."""
    out, pending = [], ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, args = pending.strip().partition(" ")
        out.append((keyword.upper(), args.strip()))
        pending = ""
    return out


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern decides, `!` re-includes; a match on a parent dir counts."""
    ignored = False
    parts = Path(path).parts
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        if any(fnmatch.fnmatch("/".join(parts[:i]), pattern) for i in range(1, len(parts) + 1)) or (
            pattern.startswith("**/") and any(fnmatch.fnmatch(p, pattern[3:]) for p in parts)
        ):
            ignored = not negate
    return ignored


def shell_commands(text: str) -> list[list[str]]:
    """Simple commands of a shell line, split on && ; | (enough for what a Dockerfile runs)."""
    return [shlex.split(part) for part in re.split(r"&&|;|\|", text) if part.strip()]


def exec_form(args: str) -> str:
    return shlex.join(json.loads(args)) if args.startswith("[") else args


def check_command(words: list[str], problems: list[str], where: str, mounted: tuple[str, ...] = ()) -> None:
    """Append to `problems` what `words` uses that the image would lack; `mounted`: dirs a volume provides."""
    program = words[0]
    if program.startswith("infir-"):
        if program not in PYPROJECT["project"]["scripts"]:
            problems.append(f"{where}: `{program}` is not a console script of pyproject.toml")
    elif program not in SHELL_BUILTINS:
        problems.append(f"{where}: `{program}` is neither a console script nor a known tool")
    for i, word in enumerate(words[1:], 1):
        if words[i - 1] == "-m" and word.startswith("infir"):
            module = REPO / word.replace(".", "/")
            if not (module.with_suffix(".py").is_file() or (module / "__init__.py").is_file()):
                problems.append(f"{where}: module {word} not in the repository")
        elif re.fullmatch(r"\.(\[[\w,-]+\])?", word):  # pip install . / .[extras]
            extras = re.findall(r"[\w-]+", word)
            missing = set(extras) - set(PYPROJECT["project"].get("optional-dependencies", {}))
            if missing:
                problems.append(f"{where}: extras {sorted(missing)} not in pyproject.toml")
        elif (
            re.fullmatch(r"[\w.-]+(/[\w.-]+)*/?", word) and ("/" in word or Path(word).suffix in {".sh", ".py", ".toml"})
            and "=" not in word and not word.startswith((".", "-"))
            and not any(word == m or word.startswith(m + "/") for m in mounted)
        ):
            if not (REPO / word).exists():
                problems.append(f"{where}: path {word} does not exist in the repository")


def test_dockerfile_uses_only_what_the_repository_has():
    text = (REPO / "Dockerfile").read_text()
    ignore = [ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    steps = instructions(text)
    problems = []

    args = {a.split("=")[0]: a.split("=", 1)[1] for k, a in steps if k == "ARG" and "=" in a}
    (base,) = [a for k, a in steps if k == "FROM"]
    base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)
    assert re.fullmatch(r"nvcr\.io/nvidia/pytorch:\d\d\.\d\d-py3", base), f"base image {base} is not an NGC PyTorch tag"

    for keyword, arg in steps:
        if keyword in ("COPY", "ADD"):
            *sources, _dest = shlex.split(arg)
            for src in (s for s in sources if not s.startswith("--")):
                if not (REPO / src).exists():
                    problems.append(f"{keyword} {src}: not in the repository")
                elif src != "." and dockerignored(src, ignore):
                    problems.append(f"{keyword} {src}: excluded by .dockerignore")
        elif keyword in ("RUN", "CMD", "ENTRYPOINT"):
            for words in shell_commands(exec_form(arg)):
                check_command(words, problems, f"{keyword} {arg}")

    pins = [Requirement(w) for k, a in steps if k == "RUN" for cmd in shell_commands(a) for w in cmd
            if w.startswith("megatron-core")]
    (allowed,) = [Requirement(d) for d in PYPROJECT["project"]["dependencies"] if d.startswith("megatron-core")]
    assert len(pins) == 1 and len(pins[0].specifier) == 1, f"megatron-core must be pinned exactly once: {pins}"
    pinned = next(iter(pins[0].specifier)).version
    if pinned not in allowed.specifier:
        problems.append(f"Dockerfile pins megatron-core {pinned}, pyproject.toml allows {allowed.specifier}")

    # the documented `docker run ... <image> CMD` lines: CMD runs inside the image, from WORKDIR = the repo
    (tag,) = set(re.findall(r"docker build .*-t (\S+) \.", text))
    documented = [line.split("#", 1)[1].strip() for line in text.splitlines() if re.match(r"#\s+docker run ", line)]
    assert any("pytest tests" in line for line in documented), "document a `docker run` that runs the test suite"
    (workdir,) = [a for k, a in steps if k == "WORKDIR"]
    for line in documented:
        words = shlex.split(line)
        image_at = words.index(tag)
        # -v HOST:CONTAINER under WORKDIR: run outputs the host provides, not repository paths
        mounted = tuple(str(Path(w.split(":")[1]).relative_to(workdir)) for prev, w in zip(words, words[1:image_at])
                        if prev == "-v" and w.split(":")[1].startswith(workdir + "/"))
        command = " ".join(shlex.quote(w) for w in words[image_at + 1:])
        for words in shell_commands(command):
            check_command(words, problems, f"documented `{line}`", mounted)
    for must_ship in ["launch/pipeline.sh", "conf/config.yaml", "eval", "pyproject.toml", "tests", "infir"]:
        if not (REPO / must_ship).exists():
            problems.append(f"{must_ship} is missing: the image runs it")
        elif dockerignored(must_ship, ignore):
            problems.append(f".dockerignore excludes {must_ship}, which the image needs")
    assert not problems, "\n".join(problems)


def test_the_checks_catch_a_broken_dockerfile():
    problems = []
    check_command(shlex.split("bash launch/no_such.sh"), problems, "x")
    check_command(shlex.split("infir-nope --help"), problems, "x")
    check_command(shlex.split("pip install -e .[nosuchextra]"), problems, "x")
    check_command(shlex.split("python -m infir.no_such_module"), problems, "x")
    assert [p.split(": ", 1)[1] for p in problems] == [
        "path launch/no_such.sh does not exist in the repository",
        "`infir-nope` is not a console script of pyproject.toml",
        "extras ['nosuchextra'] not in pyproject.toml",
        "module infir.no_such_module not in the repository",
    ]
    assert dockerignored("outputs/demo/x", ["outputs"]) and dockerignored("infir/a/__pycache__/b.pyc", ["**/__pycache__"])
    assert not dockerignored("outputs/keep", ["outputs", "!outputs/keep"])
