"""ONNX's backend node tests through aotc.onnx_backend: what is excluded and why, what aotc refuses today,
and a survey that runs them all (issue 19; docs/onnx-conformance.md).

    .venv/bin/python -m tests.onnx_conformance [--processes 2] [--write] [--json out.json]

prints the count of each status (pass, refused, mismatch, internal error, excluded) and the biggest
refusal causes; --write rewrites REFUSED_FILE, the list tests/test_onnx_backend.py expects to be refused.
Each test runs exactly as the pytest module runs it: the method onnx.backend.test.BackendTest made for it.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFUSED_FILE = Path(__file__).parent / "data" / "onnx_backend_refused.txt"
DEFAULT_CACHE = ROOT / ".pytest_cache" / "d" / "aotc-onnx-backend"  # where the pytest module keeps its builds
CATEGORY = "OnnxBackendNodeModelTest"  # BackendTest's test case class of the node tests
TEST_TIMEOUT = 300  # seconds one test may take in the survey before its worker is killed

# Tests that are not about what an ahead-of-time tensor compiler can do, matched (re.search) against the
# BackendTest method name (`test_<case>_cpu`). Each entry: (pattern, reason). Everything else counts, and
# what aotc does not do is a refusal, not an exclusion.
EXCLUDED: list[tuple[str, str]] = [
    # sequence values: SequenceConstruct/Insert/At/Map, SplitToSequence, and If/Loop bodies producing them
    (
        r"^test_(sequence_|split_to_sequence_|identity_sequence_|if_seq_|loop13_seq_|loop16_seq_none_)",
        "sequence types (not tensors)",
    ),
    # optional values: Optional, OptionalHasElement, OptionalGetElement
    (r"^test_(optional_|identity_opt_|if_opt_)", "optional types (not tensors)"),
    # the ai.onnx.ml domain (LabelEncoder, TreeEnsemble, Binarizer, ArrayFeatureExtractor)
    (r"^test_ai_onnx_ml_", "ai.onnx.ml operators (classical ML, not neural networks)"),
    # string tensors: StringConcat/Split, StringNormalizer, RegexFullMatch, Equal on strings
    (r"^test_(string_|strnormalizer_|regex_full_match_|equal_string)", "string tensors"),
    # ai.onnx.preview.training: optimizer update rules
    (r"^test_(adagrad|adam|momentum|nesterov_momentum)", "training operators (optimizer steps)"),
    # training_mode=1: BatchNormalization updating its statistics, Dropout drawing a random mask
    (r"^test_training_dropout|^test_batchnorm_\w+_training_mode_", "training mode (inference compiler)"),
    # random draws: outputs depend on the generator, no reference values to compare
    (r"^test_bernoulli", "random operators"),
    # inverse DFT: where the exact result is 0, the expected output holds numpy's single-precision FFT
    # rounding (1.9e-7) and the suite allows 1e-7; onnxruntime fails them too (onnx/onnx#4798)
    (r"^test_dft_inverse", "expected outputs off by more than the suite's tolerance (float32 FFT rounding)"),
]


def exclusion(test: str) -> str | None:
    """Why `test` (a BackendTest method name) is excluded, or None."""
    return next((reason for pattern, reason in EXCLUDED if re.search(pattern, test)), None)


def load_refused() -> set[str]:
    """The tests aotc is expected to refuse (REFUSED_FILE: one method name a line, `#` comments)."""
    lines = REFUSED_FILE.read_text().splitlines() if REFUSED_FILE.exists() else []
    return {line.split("#")[0].strip() for line in lines} - {""}


@functools.cache
def node_test_case(backend: type) -> type[unittest.TestCase]:
    """BackendTest's test case class of the node tests for `backend`, CPU methods only (the backend runs
    on the CPU; BackendTest would add a skipped CUDA twin of each)."""
    import onnx.backend.test

    with warnings.catch_warnings():  # the case generators overflow casts on purpose
        warnings.simplefilter("ignore", RuntimeWarning)
        generated = onnx.backend.test.BackendTest(backend, __name__).test_cases[CATEGORY]
    methods = {name: getattr(generated, name) for name in dir(generated) if name.endswith("_cpu")}
    return type(CATEGORY, (unittest.TestCase,), methods)


def check(backend: type, test: str) -> tuple[str, str]:
    """(status, message) of one test: pass, excluded, refused (one of aotc's REFUSALS), mismatch (an
    AssertionError of the comparison) or error (anything else). A pass whose build took graph inputs as
    constants (values aotc needs at compile time, fed at run time by the test) says which."""
    from aotc.onnx_backend import REFUSALS

    reason = exclusion(test)
    if reason is not None:
        return "excluded", reason
    case = node_test_case(backend)
    prepared = getattr(backend, "prepared", None)
    if prepared is not None:
        prepared.clear()
    try:
        getattr(case(test), test)()
    except REFUSALS as e:
        return "refused", f"{type(e).__name__}: {e}"
    except AssertionError as e:
        return "mismatch", str(e)
    except Exception as e:
        return "error", f"{type(e).__name__}: {e}"
    fixed = sorted({name for rep in prepared or () for name in getattr(rep, "fixed", ())})
    return "pass", f"{CONSTANTS_NOTE}{', '.join(fixed)}" if fixed else ""


CONSTANTS_NOTE = "built with run-time inputs as constants: "


def recording_backend() -> type:
    """AotcBackend keeping the models it prepares (`prepared`), so a check can tell which inputs their
    builds took as constants."""
    from aotc.onnx_backend import AotcBackend

    class RecordingBackend(AotcBackend):
        prepared: list = []

        @classmethod
        def prepare(cls, model, device: str = "CPU", **kwargs):
            rep = super().prepare(model, device, **kwargs)
            cls.prepared.append(rep)
            return rep

    return RecordingBackend


def refusal_cause(message: str) -> str:
    """A refusal message without what varies from test to test (paths, node names, numbers): the group
    it counts in."""
    kind, _, text = message.partition(": ")
    text = re.sub(r"^\S+\.onnx: ", "", text)
    if kind == "UnsupportedOpsetError":
        if "imports no version" in text:
            return "the model imports no default-domain opset (other domains only)"
        if re.match(r"opset \d+ is newer than the installed onnx", text):
            return "the model's opset is newer than the installed onnx defines"
        # an operator version aotc does not handle: grouped by operator version, as the generic rules do
    if kind == "UnsupportedOperatorError":
        ops = re.sub(r" \(nodes: [^)]*\)", "", text.split(": ", 1)[1])
        return f"unsupported operator: {ops}"
    text = re.sub(r"node \S+ \((\w+)\)", r"\1", text)
    text = re.sub(r", value [^)]*\)", ")", text)
    text = re.sub(r"input '?[\w.]+'? has zero-size", "an input has zero-size", text)
    text = re.sub(r"\[[\d, ?]*\]", "[...]", text)
    text = re.sub(r"dimension [\d, ]+", "dimension N ", text)
    return text.split(";")[0][:140]


# ----------------------------------------------------------------------------- the survey


def _worker(cache: str) -> None:
    """Check the test names read from stdin, one JSON line of results each on stdout."""
    backend = recording_backend()
    backend.cache_dir = Path(cache)
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything else printed goes to stderr, not into the results
    node_test_case(backend)
    for line in sys.stdin:
        test, start = line.strip(), time.perf_counter()
        status, message = check(backend, test)
        out.write(
            json.dumps(
                {"test": test, "status": status, "message": message, "seconds": time.perf_counter() - start}
            )
        )
        out.write("\n")
        out.flush()


def survey(tests: list[str], processes: int, cache: Path) -> dict[str, dict]:
    """Every test's result, checked in `processes` worker processes; a test that kills or hangs its
    worker is an error, and a new worker goes on with the rest."""
    todo = collections.deque(tests)
    results: dict[str, dict] = {}
    lock = threading.Lock()

    def run_worker() -> None:
        while True:
            with lock:
                if not todo:
                    return
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.onnx_conformance", "--worker", "--cache", str(cache)],
                cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            )  # fmt: skip
            while True:
                with lock:
                    test = todo.popleft() if todo else None
                if test is None:
                    proc.stdin.close()
                    proc.wait()
                    return
                proc.stdin.write(test + "\n")
                proc.stdin.flush()
                timer = threading.Timer(TEST_TIMEOUT, proc.kill)
                timer.start()
                line = proc.stdout.readline()
                timer.cancel()
                if line:
                    result = json.loads(line)
                    with lock:
                        results[test] = result
                    continue
                proc.wait()
                why = (
                    f"timed out after {TEST_TIMEOUT} s"
                    if proc.returncode == -9
                    else f"exit status {proc.returncode}"
                )
                with lock:
                    results[test] = {"test": test, "status": "error", "message": f"the worker died ({why})"}
                break  # a new worker for the rest

    threads = [threading.Thread(target=run_worker) for _ in range(max(processes, 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {t: results[t] for t in tests}


def write_refused(results: dict[str, dict]) -> None:
    refused = sorted(t for t, r in results.items() if r["status"] == "refused")
    lines = [
        "# ONNX backend node tests that aotc refuses today (tests/test_onnx_backend.py expects each refusal).",
        "# Generated by `python -m tests.onnx_conformance --write`; the comment is the refusal's cause.",
        *(f"{t}  # {refusal_cause(results[t]['message'])}" for t in refused),
    ]
    REFUSED_FILE.write_text("\n".join(lines) + "\n")


def summary(results: dict[str, dict], top: int = 10) -> str:
    counts = collections.Counter(r["status"] for r in results.values())
    counted = sum(n for s, n in counts.items() if s != "excluded")
    lines = [f"{len(results)} node tests, {counts['excluded']} excluded, {counted} counted:"]
    for status in ("pass", "refused", "mismatch", "error"):
        share = 100 * counts[status] / counted if counted else 0
        lines.append(f"  {status:<9} {counts[status]:>5}  {share:5.1f}%")
        if status == "pass":
            constants = sum(r["message"].startswith(CONSTANTS_NOTE) for r in results.values())
            lines.append(f"    of which {constants} built with run-time inputs as constants (see --json)")
    causes = collections.Counter(
        refusal_cause(r["message"]) for r in results.values() if r["status"] == "refused"
    )
    lines.append(f"biggest refusal causes ({len(causes)} in all):")
    lines += [f"  {n:>5}  {cause}" for cause, n in causes.most_common(top)]
    for status in ("mismatch", "error"):
        lines += [f"{status}: {t}: {r['message'][:300]}" for t, r in results.items() if r["status"] == status]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="build cache (default: pytest's)")
    parser.add_argument("--write", action="store_true", help=f"rewrite {REFUSED_FILE.relative_to(ROOT)}")
    parser.add_argument("--json", type=Path, help="write every test's result here")
    parser.add_argument("-k", dest="pattern", help="only tests whose name matches this regular expression")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(str(args.cache))
        return 0
    from aotc.onnx_backend import AotcBackend

    tests = sorted(n for n in dir(node_test_case(AotcBackend)) if n.endswith("_cpu"))
    if args.pattern:
        tests = [t for t in tests if re.search(args.pattern, t)]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="aotc-conformance-") as home:
        os.environ.setdefault("AOTC_HOME", home)  # as in pytest: no user store read or written
        os.environ.setdefault("AOTC_TOPHUB", "none")
        results = survey(tests, args.processes, args.cache)
    print(summary(results))
    print(f"{len(tests)} tests in {time.perf_counter() - start:.0f} s with {args.processes} processes")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    if args.write:
        if args.pattern:
            parser.error("--write needs every test (no -k)")
        write_refused(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
