"""The locks in requirements/ are what pyproject.toml resolves to, and the .venv is built
from them: a pin changed in one place only fails here."""

import re
import shlex
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
LOCKS = [ROOT / "requirements" / "runtime.txt", ROOT / "requirements" / "dev.txt"]
PIN = re.compile(r"^([A-Za-z0-9_.-]+)==([^ ;\\]+)( ;[^\\]*)?", re.MULTILINE)


def pins(lock: Path) -> dict[str, tuple[str, str | None]]:
    """Each locked package: its version and its environment marker, if any."""
    return {m[1].lower(): (m[2], m[3]) for m in PIN.finditer(lock.read_text())}


def body(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("#")]


@pytest.mark.any_python
@pytest.mark.parametrize("lock", LOCKS, ids=lambda lock: lock.name)
def test_the_lock_is_what_pyproject_resolves_to(lock, tmp_path):
    """The command in the lock's header, run again on a copy: uv keeps the versions the
    lock already has, so only a change to pyproject.toml (or to the lock) makes a difference."""
    command = shlex.split(lock.read_text().splitlines()[1].lstrip("# "))
    assert command[:3] == ["uv", "pip", "compile"]
    output = command.index("-o") + 1
    copy = tmp_path / lock.name
    shutil.copy(lock, copy)
    command[output] = str(copy)
    uv = shutil.which("uv", path=str(Path(sys.executable).parent))
    assert uv, "uv is missing from the .venv: run make test, which installs it"
    done = subprocess.run([uv, *command[1:], "-q"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert body(copy.read_text()) == body(lock.read_text()), "run `make lock` and commit"


@pytest.mark.any_python
def test_the_layer_and_the_venv_lock_the_same_versions():
    runtime, dev = (pins(lock) for lock in LOCKS)
    assert {name: dev[name] for name in runtime} == runtime


def test_the_venv_has_the_locked_versions():
    """What the Makefile installed is what the lock says (packages without a marker: the
    others depend on the platform or the Python version)."""
    locked = {name: v for name, (v, marker) in pins(LOCKS[1]).items() if marker is None}
    assert {name: version(name) for name in locked} == locked
