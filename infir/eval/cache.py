"""The per-sample jsonl of one benchmark, which is also the resume cache.

Each line is one graded sample. A problem's samples are appended together once all of them are
graded, so after an interruption a problem is either complete or (its last lines cut short)
incomplete, and incomplete problems are simply generated again. A meta file pins what the samples
were generated with, so a resumed run cannot silently mix two settings in one number.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path


class SampleCache:
    def __init__(self, path: Path, fingerprint: dict, n: int):
        self.path, self.n = Path(path), n
        self.path.parent.mkdir(parents=True, exist_ok=True)
        meta_path = self.path.with_suffix(".meta.json")
        if meta_path.exists():
            stored = json.loads(meta_path.read_text())
            if stored != fingerprint:
                changed = sorted(k for k in set(stored) | set(fingerprint) if stored.get(k) != fingerprint.get(k))
                raise ValueError(
                    f"{self.path} holds samples generated with other settings (differing: {changed}); "
                    "use a new out_dir, or delete that file to start this benchmark over")
        else:
            meta_path.write_text(json.dumps(fingerprint, indent=1, sort_keys=True))
        self._rows: dict[str, list[dict]] = defaultdict(list)
        if self.path.exists():
            self._load()

    def _load(self) -> None:
        with open(self.path) as f:
            lines = f.read().split("\n")
        for line in lines:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # the torn last line of an interrupted write
            self._rows[row["problem_id"]].append(row)
        incomplete = [pid for pid, rows in self._rows.items() if len(rows) != self.n]
        for pid in incomplete:
            del self._rows[pid]
        if incomplete or (lines and lines[-1].strip()):
            self._rewrite()  # drop torn and partial lines so the file holds complete problems only

    def _rewrite(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            for rows in self._rows.values():
                f.writelines(json.dumps(r) + "\n" for r in rows)
        tmp.replace(self.path)

    def done(self, problem_id: str) -> bool:
        return problem_id in self._rows

    def add(self, problem_id: str, rows: list[dict]) -> None:
        if len(rows) != self.n:
            raise ValueError(f"cache: problem {problem_id} has {len(rows)} samples, expected {self.n}")
        with open(self.path, "a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
            f.flush()
        self._rows[problem_id] = rows

    def rows(self, problem_id: str) -> list[dict]:
        return self._rows[problem_id]
