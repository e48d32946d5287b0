"""One virtualenv per system under bench/.venv-peers/, never the project's own .venv.

Why not one shared venv: the peers pin incompatible redis-py ranges (arq 0.28 wants
redis<6, saq 0.26 redis<8, kombu 5.7 redis<6.5, bullmq 3.4 redis>=6.2), so one venv would
hold duetime back on redis-py 5 and bullmq on an old 2.x. Each system gets the newest
versions its own pins allow, listed in ``requirements/<system>.txt``; the ``duetime`` venv
(duetime installed editable from this work tree) also runs the suite itself.

A venv is (re)built when its requirements file changes (a hash is kept in it). Standard
library only: this runs before any venv exists.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

PEERS = Path(__file__).resolve().parent
ROOT = PEERS.parents[1]  # the project: bench/peers -> bench -> root
VENVS = ROOT / "bench" / ".venv-peers"
REQUIREMENTS = PEERS / "requirements"
RUNNER = "duetime"  # the venv that runs the suite


@dataclass(frozen=True, slots=True)
class Venv:
    system: str
    path: Path
    error: str = ""  # why it could not be built ("" when it is usable)

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def bin(self) -> Path:
        return self.path / "bin"


def systems() -> list[str]:
    """Every system with a requirements file, duetime first."""
    names = sorted(p.stem for p in REQUIREMENTS.glob("*.txt"))
    return [RUNNER, *(n for n in names if n != RUNNER)]


def _fingerprint(system: str) -> str:
    text = (REQUIREMENTS / f"{system}.txt").read_text()
    return hashlib.sha256(f"{sys.version}\n{text}".encode()).hexdigest()


def ensure(system: str, log: bool = True) -> Venv:
    """The venv of ``system``, built first if missing or out of date."""
    path = VENVS / system
    stamp = path / ".bench-requirements"
    wanted = _fingerprint(system)
    if stamp.exists() and stamp.read_text() == wanted and (path / "bin" / "python").exists():
        return Venv(system, path)
    if log:
        print(f"building {path.relative_to(ROOT)} ...", flush=True)
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    logfile = VENVS / f"{system}.install.log"
    commands = [
        [sys.executable, "-m", "venv", str(path)],
        [str(path / "bin" / "python"), "-m", "pip", "install", "--quiet",
         "--disable-pip-version-check", "-r", str(REQUIREMENTS / f"{system}.txt"),
         *(["-e", str(ROOT)] if system == RUNNER else [])],
    ]  # fmt: skip
    with logfile.open("w") as out:
        for command in commands:
            done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
            if done.returncode != 0:
                tail = logfile.read_text().strip().splitlines()[-3:]
                return Venv(system, path, f"install failed: {' | '.join(tail)}")
    stamp.write_text(wanted)
    return Venv(system, path)


def ensure_all(names: list[str]) -> dict[str, Venv]:
    """Build the venvs of ``names`` in parallel; failures are returned, not raised."""
    with ThreadPoolExecutor(4) as pool:
        return dict(zip(names, pool.map(ensure, names), strict=True))


if __name__ == "__main__":
    for venv in ensure_all(systems()).values():
        print(f"{venv.system:10} {venv.error or venv.path}")
