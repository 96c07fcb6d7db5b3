"""The package as a user installs it: `python -m build` makes a wheel and an sdist, and the
wheel in a bare virtual environment gives the client and the CLI, without the embedded
runtime (the `local` extra)."""

import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tocsin.cli import LOCAL_EXTRA

ROOT = Path(__file__).parents[2]
PACKAGE_FILES = ("pyproject.toml", "README.md", "LICENSE")
LEFT_OUT = ("__pycache__", "*.egg-info")

pytestmark = [pytest.mark.slow, pytest.mark.any_python]


def run(*command: str | Path, **options) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(part) for part in command], capture_output=True, text=True, timeout=600, **options
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """Built from a copy of what the package is made of: setuptools builds in the folder it
    is given, where `sam build` may be building the layer's copy of the package too."""
    source, dist = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("dist")
    for name in PACKAGE_FILES:
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns(*LEFT_OUT))
    done = run(sys.executable, "-m", "build", "--installer", "uv", "--outdir", dist, source)
    assert done.returncode == 0, done.stderr[-2000:]
    return dist


@pytest.fixture(scope="module")
def bare(built, tmp_path_factory) -> Path:
    """A virtual environment with only the wheel and what it depends on, at the versions
    the layer's lock holds (so that uv's cache has them)."""
    where = tmp_path_factory.mktemp("bare")
    venv.create(where, with_pip=False)
    pins = tmp_path_factory.mktemp("pins") / "constraints.txt"
    lock = (ROOT / "requirements" / "runtime.txt").read_text()
    pins.write_text("\n".join(re.findall(r"^[A-Za-z0-9_.-]+==[^ \\]+", lock, re.MULTILINE)))
    [wheel] = built.glob("tocsin-*.whl")
    uv = Path(sys.executable).parent / "uv"
    done = run(uv, "pip", "install", "-q", "--python", where / "bin" / "python", wheel, "-c", pins)
    assert done.returncode == 0, done.stderr
    return where


def test_the_build_makes_a_wheel_and_an_sdist_that_carry_the_licence(built):
    names = sorted(path.name for path in built.iterdir())
    assert [n for n in names if n.endswith(".whl")] and [n for n in names if n.endswith(".tar.gz")]
    [wheel] = built.glob("*.whl")
    listing = run(sys.executable, "-m", "zipfile", "-l", wheel).stdout
    assert "licenses/LICENSE" in listing and "tocsin/console/assets/" in listing


def test_a_bare_environment_gets_the_client_and_the_cli_without_the_embedded_runtime(bare):
    python, tocsin = bare / "bin" / "python", bare / "bin" / "tocsin"
    client = run(python, "-c", "from tocsin.client import Client; print(Client.submit.__name__)")
    assert client.returncode == 0 and client.stdout.strip() == "submit", client.stderr
    for verb in ("submit", "get", "list", "cancel", "reschedule", "schedule", "redrive", "console"):
        helped = run(tocsin, verb, "--help")
        assert helped.returncode == 0 and "usage: tocsin" in helped.stdout, (verb, helped.stderr)
    absent = run(
        python,
        "-c",
        f"import importlib.util as u; print([m for m in {LOCAL_EXTRA!r} if u.find_spec(m)])",
    )
    assert absent.stdout.strip() == "[]"


def test_a_verb_of_the_embedded_runtime_says_in_one_line_what_it_needs(bare):
    refused = run(bare / "bin" / "tocsin", "serve", "--port", "0")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "error: tocsin serve runs the embedded runtime: pip install 'tocsin[local]'"
    ]
