"""What a console script said on stderr, without its progress bars (tqdm redraws a line with \r)."""


def messages(stderr: str) -> list[str]:
    """The non-empty lines of `stderr` that are not progress-bar updates."""
    return [line for line in stderr.split("\n") if line.strip() and "\r" not in line]
