"""Load, verify and run (possibly hostile) packages in a child process, one case after another.

A case that kills the child (a signal, an abort) or hangs is recorded as such, and a fresh child
takes the next case, so thousands of cases cost one interpreter start each time a case crashes.
Run as `python -m tests.package_runner`: it reads one JSON request per stdin line and answers one line.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
_REPLY = "@@case "


def fingerprint(outputs: dict[str, np.ndarray]) -> dict[str, list]:
    """Each output's dtype, shape and the sha256 of its bytes: equal only when bit-for-bit equal."""
    return {
        name: [a.dtype.name, list(a.shape), hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()]
        for name, a in sorted(outputs.items())
    }


def attempt(path: str, inputs_path: str, describe: bool = True) -> dict:
    """What happens to package `path`: verify (and describe), load, run and profile it on the inputs."""
    import aotc_runtime
    from aotc_runtime import PackageError

    try:
        aotc_runtime.verify_package(path)
        if describe:
            from aotc.package import describe_package

            describe_package(path)
        model = aotc_runtime.load(path)
        with np.load(inputs_path, allow_pickle=False) as data:
            inputs = {k: data[k] for k in data.files}
        outputs = model.run(inputs)
        profiled = {name: np.zeros_like(a) for name, a in outputs.items()}  # the variant the inputs chose
        model.profile(inputs, outputs=profiled, repeat=1, warmup=0)
        return {"status": "ok", "outputs": fingerprint(outputs), "profiled": fingerprint(profiled)}
    except PackageError as err:
        return {"status": "PackageError", "message": str(err)}
    except Exception as err:  # noqa: BLE001 - the point is to report every other kind of failure
        return {"status": "error", "type": type(err).__name__, "message": str(err)}


def _child() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        reply = attempt(request["path"], request["inputs"], request.get("describe", True))
        sys.stdout.write(_REPLY + json.dumps(reply) + "\n")
        sys.stdout.flush()


class PackageRunner:
    """A child process that attempts cases in turn; restarted after a case that kills it."""

    def __init__(self, env: dict[str, str] | None = None, timeout: float = 60.0) -> None:
        self.env = {**os.environ, **(env or {})}
        self.timeout = timeout
        self.restarts = 0
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> PackageRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._proc is not None:
            self._proc.stdin.close()
            self._proc.wait(timeout=30)
            self._proc = None

    def _start(self) -> subprocess.Popen:
        if self._proc is None:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "tests.package_runner"],
                cwd=REPO,
                env=self.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                bufsize=1,
            )
        return self._proc

    def attempt(self, path: str, inputs_path: str, describe: bool = True) -> dict:
        """The child's report on one case, or {"status": "signal"/"exit"/"timeout", ...} when it died."""
        proc = self._start()
        request = {"path": str(path), "inputs": str(inputs_path), "describe": describe}
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
        except BrokenPipeError:
            return self._died()
        while True:
            ready, _, _ = select.select([proc.stdout], [], [], self.timeout)
            if not ready:
                proc.kill()
                proc.wait()
                self._proc = None
                self.restarts += 1
                return {"status": "timeout"}
            line = proc.stdout.readline()
            if not line:
                return self._died()
            if line.startswith(_REPLY):
                return json.loads(line[len(_REPLY) :])

    def attempt_all(self, cases: Iterable[tuple[str, str]], inputs_path: str, describe: bool = True) -> dict:
        """{case name: report} for (name, package path) pairs."""
        return {name: self.attempt(path, inputs_path, describe) for name, path in cases}

    def _died(self) -> dict:
        proc, self._proc = self._proc, None
        rc = proc.wait()
        self.restarts += 1
        if rc < 0:
            return {"status": "signal", "signal": -rc}
        return {"status": "exit", "returncode": rc}


if __name__ == "__main__":
    _child()
