"""Run pykka's own test suite against our native gevent runtime.

pykka's tests are parametrised by a ``runtime`` fixture (actor class, event class,
future class, sleep function); upstream lists only threading. This script fetches
the sdist of the *installed* pykka version (its tests are not in the wheel), adds
``GeventActor``/``GeventFuture`` to that list, and runs the suite, threading and
gevent side by side. Exit status is pytest's.

Usage: ``python tests/upstream/run_pykka_suite.py [pytest args...]`` (needs network
access to PyPI, as ``pip install`` does; ``--sdist PATH`` uses a local copy).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

GEVENT_RUNTIME = """
import gevent
import gevent.event
from subagents.actors._kernel import GeventActor, GeventFuture

RUNTIMES["gevent"] = pytest.param(
    Runtime(
        name="gevent",
        actor_class=GeventActor,
        event_class=gevent.event.Event,
        future_class=GeventFuture,
        sleep_func=gevent.sleep,
    ),
    id="gevent",
)
"""


def _sdist(version: str, into: Path) -> Path:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"pykka=={version}",
            "-d",
            str(into),
        ],
        check=True,
    )
    return next(into.glob("pykka-*.tar.gz"))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sdist", type=Path, help="a pykka sdist to take the tests from")
    args, pytest_args = parser.parse_known_args(argv)
    version = importlib.metadata.version("pykka")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sdist = args.sdist or _sdist(version, work)
        with tarfile.open(sdist) as archive:
            members = [m for m in archive.getmembers() if "/tests/" in m.name]
            archive.extractall(work, members=members, filter="data")
        (root,) = [p for p in work.iterdir() if p.is_dir() and p.name.startswith("pykka-")]
        conftest = root / "tests" / "conftest.py"
        text = conftest.read_text()
        anchor = '\n\n@pytest.fixture(scope="session", params=RUNTIMES.values())'
        if anchor not in text:
            print(f"pykka {version}: its conftest changed; update {__file__}", file=sys.stderr)
            return 2
        conftest.write_text(text.replace(anchor, "\n" + GEVENT_RUNTIME + anchor, 1))
        print(f"pykka {version}: upstream tests, threading and gevent runtimes", flush=True)
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args],
            cwd=root,
            check=False,
        ).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
