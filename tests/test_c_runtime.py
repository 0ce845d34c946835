"""The C runtime (runtime/c, docs/c-runtime.md) against the Python runtime: the example program
examples/c/run_model, built with the host's cc, runs aotc packages to outputs bit-for-bit equal to
`aotc_runtime.load(path).run(...)` (a plain MLP, a package of two batch sizes at its second variant, a CNN
whose Winograd weights are computed at load, a zip64 rewrite), and refuses damaged, edited, foreign and
unsupported packages with a specific status and message, never a signal (also under AddressSanitizer and
UBSan). The C API's argument checks and concurrent runs through a small C program. Where
aarch64-linux-gnu-gcc and qemu-aarch64 exist, the runtime cross-built for AArch64 runs a cortex-a72 package
under qemu to the host's outputs, and refuses a neoverse-n1 package on a cortex-a72 (HWCAP bits)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import struct
import subprocess
import zipfile
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

import aotc_runtime
import numpy as np
import pytest
from aotc_runtime.elf import read_elf
from aotc_runtime.package import read_package

import aotc
from recipes.zoo import onnx_models as models

REPO = Path(__file__).resolve().parent.parent
C_RUNTIME = REPO / "runtime" / "c"
SYSROOT = "/usr/aarch64-linux-gnu"
CORTEX_A72 = "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"
NEOVERSE_N1 = "llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1"

# aotc_status (runtime/c/aotc_runtime.h), the example's exit status on a runtime error
IO, FORMAT, CHECKSUM, UNSUPPORTED, LIBRARY, INVALID_ARGUMENT = 1, 2, 3, 4, 5, 6

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None or shutil.which("make") is None, reason="no C compiler (cc) or make"
)
needs_aarch64 = pytest.mark.skipif(
    shutil.which("aarch64-linux-gnu-gcc") is None
    or shutil.which("qemu-aarch64") is None
    or not os.path.exists(f"{SYSROOT}/lib/libc.so.6")
    or (shutil.which("ld.lld") is None and shutil.which("aarch64-linux-gnu-ld") is None),
    reason="needs aarch64-linux-gnu-gcc, qemu-aarch64 and the arm64 C library "
    "(apt-get install gcc-aarch64-linux-gnu qemu-user libc6-dev-arm64-cross lld)",
)


def build_runtime(build: Path, *options: str) -> Path:
    """`make -C runtime/c` into `build`; returns it (run_model, aotc_selftest, the libraries)."""
    proc = subprocess.run(
        ["make", "-C", str(C_RUNTIME), "-j2", f"BUILD={build}", *options], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return build


def compile_package(directory: Path, model, name: str, target: str = "llvm", **options) -> Path:
    onnx_path = models.save(model, directory / f"{name}.onnx")
    return Path(
        aotc.compile(onnx_path, target, output=directory / f"{name}.aotc", validate=False, **options).path
    )


def run_model(
    build: Path,
    package: Path,
    inputs: list[np.ndarray],
    workdir: Path,
    *options: str,
    emulate: Sequence[str] = (),
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    """The example on raw input files; outputs go to workdir/out."""
    files = []
    for i, a in enumerate(inputs):
        files.append(str(workdir / f"input{i}.bin"))
        np.ascontiguousarray(a).tofile(files[-1])
    command = [*emulate, str(build / "run_model"), str(package), *options, *files, "-o", str(workdir / "out")]
    environment = None if env is None else {**os.environ, **env}
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=environment)


def read_outputs(workdir: Path, like: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {
        name: np.fromfile(workdir / "out" / f"{name}.bin", a.dtype).reshape(a.shape)
        for name, a in like.items()
    }


def python_outputs(package: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return aotc_runtime.load(str(package)).run(inputs)


def assert_ran(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stdout + proc.stderr


def assert_refused(proc: subprocess.CompletedProcess, status: int, fragment: str) -> None:
    """The example exited with `status` (never a signal) and printed the runtime's message."""
    assert proc.returncode == status, (proc.returncode, proc.stdout, proc.stderr)
    assert fragment in proc.stderr, proc.stderr


def plan_of(package: Path) -> dict:
    with zipfile.ZipFile(package) as zf:
        raw = read_elf(zf.read("lib/model.so")).section(".aotc_plan")
    return json.loads(raw.rstrip(b"\0"))


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def host(tmp_path_factory) -> Path:
    return build_runtime(tmp_path_factory.mktemp("c-runtime-host"))


@pytest.fixture(scope="module")
def packages(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("c-runtime-packages")


@pytest.fixture(scope="module")
def mlp(packages) -> Path:
    return compile_package(packages, models.mlp(), "mlp")


@pytest.fixture(scope="module")
def mlp_members(mlp) -> dict[str, bytes]:
    with zipfile.ZipFile(mlp) as zf:
        return {i.filename: zf.read(i) for i in zf.infolist()}


@pytest.fixture(scope="module")
def cnn(packages) -> Path:
    return compile_package(packages, models.small_cnn(size=16), "cnn", weights="compact")


def mlp_input(batch: int = 1) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((batch, 64)).astype("float32")


# ----------------------------------------------------------------------------- the runtime's pieces


def test_selftest_and_sha256_against_hashlib(host, tmp_path):
    """SHA-256 and CRC-32 vectors and JSON accept/reject cases (selftest.c), then SHA-256 of 1 MB of
    random bytes against hashlib."""
    proc = subprocess.run([str(host / "aotc_selftest")], capture_output=True, text=True)
    assert proc.returncode == 0 and "selftest passed" in proc.stdout, proc.stderr
    data = np.random.default_rng(5).integers(0, 256, 1_000_003, dtype=np.uint8).tobytes()
    (tmp_path / "blob").write_bytes(data)
    proc = subprocess.run(
        [str(host / "aotc_selftest"), "sha256", str(tmp_path / "blob")], capture_output=True
    )
    assert proc.stdout.decode().strip() == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize(
    "document",
    [
        {"b": [1, -2, {"z": None, "a": True}], "a": 'caf\u00e9 \U0001f600 \t\n"\\/\x7f\x01', "": []},
        {"plan_version": 1, "inputs": [{"name": "x", "shape": [1, 64], "dtype": "float32"}], "e": {}},
        ["\ud800", 9223372036854775807, -9223372036854775808, False],
    ],
)
def test_canonical_json_is_pythons(host, tmp_path, document):
    """The C writer a plan is compared against produces json.dumps(sort_keys, compact, ensure_ascii)."""
    path = tmp_path / "doc.json"
    text = json.dumps(document, indent=1, ensure_ascii=False)
    try:
        path.write_bytes(text.encode("utf-8"))  # raw UTF-8 in the strings
    except UnicodeEncodeError:  # a lone surrogate has no UTF-8: escaped
        path.write_text(json.dumps(document, indent=1))
    proc = subprocess.run(
        [str(host / "aotc_selftest"), "canonical", str(path)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.rstrip("\n") == json.dumps(document, sort_keys=True, separators=(",", ":"))


def test_library_exports_only_the_api(host):
    proc = subprocess.run(
        ["nm", "-D", "--defined-only", str(host / "libaotc_runtime.so")], capture_output=True, text=True
    )
    names = {line.split()[-1] for line in proc.stdout.splitlines() if line.strip()}
    assert "aotc_model_open" in names and "aotc_model_run" in names
    assert all(n.startswith(("aotc_model_", "aotc_status_name", "aotc_last_error")) for n in names), names


# ----------------------------------------------------------------------------- running packages


def test_mlp_matches_python_runtime_bit_for_bit_at_1_and_2_threads(host, mlp, tmp_path):
    x = mlp_input()
    want = python_outputs(mlp, {"input": x})
    for threads in ("1", "2"):
        proc = run_model(host, mlp, [x], tmp_path, "--threads", threads, "--repeat", "3")
        assert_ran(proc)
        assert "input input: float32[1, 64] (256 bytes)" in proc.stdout
        assert f"with {threads} threads" in proc.stdout and "ms per run" in proc.stdout
        got = read_outputs(tmp_path, want)
        assert all(np.array_equal(got[n], want[n]) for n in want), threads


def test_variants_package_runs_its_second_variant(host, packages, tmp_path):
    package = compile_package(
        packages, models.mlp(), "mlp_variants", inputs={"input": {"shape": [[1, 2], 64]}}
    )
    x = mlp_input(batch=2)
    want = python_outputs(package, {"input": x})
    for options in (("--variant", "1"), ()):  # given, then picked by the input file's size
        proc = run_model(host, package, [x], tmp_path, *options)
        assert_ran(proc)
        assert "ran variant 1" in proc.stdout and "variant 1\n  input input: float32[2, 64]" in proc.stdout
        got = read_outputs(tmp_path, want)
        assert np.array_equal(got["output"], want["output"])
    proc = run_model(host, package, [x], tmp_path, "--variant", "0")
    assert_refused(
        proc,
        INVALID_ARGUMENT,
        "input 'input' of model 'mlp_variants' (variant 0: float32[1, 64]) is 256 bytes, got 512",
    )
    proc = run_model(host, package, [x], tmp_path, "--variant", "2")
    assert_refused(proc, INVALID_ARGUMENT, "has 2 variants; variant 2 does not exist")


def test_cnn_with_weights_computed_at_load(host, cnn, tmp_path):
    """A package whose plan has `prepare`: weights.bin holds part of the weights and the library's
    prepare function computes the rest at open (Winograd transforms)."""
    plan = plan_of(cnn)
    assert "prepare" in plan and plan["weights_stored_nbytes"] < plan["weights_nbytes"]
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype("float32")
    want = python_outputs(cnn, {"input": x})
    assert_ran(run_model(host, cnn, [x], tmp_path))
    assert np.array_equal(read_outputs(tmp_path, want)["output"], want["output"])


def zip64_of(entries: list[tuple[str, bytes]]) -> bytes:
    """A stored zip whose every size and offset lives in zip64 extra fields, with a zip64 end record, as
    aotc writes a package holding a member of 4 GiB or more."""
    out, central = bytearray(), bytearray()
    for name, data in entries:
        raw, crc, offset = name.encode(), zlib.crc32(data), len(out)
        local_extra = struct.pack("<HHQQ", 1, 16, len(data), len(data))
        out += struct.pack(
            "<IHHHHHIIIHH", 0x04034B50, 45, 0, 0, 0, 0, crc, 2**32 - 1, 2**32 - 1, len(raw), 20
        )
        out += raw + local_extra + data
        extra = struct.pack("<HHQQQ", 1, 24, len(data), len(data), offset)
        central += struct.pack(
            "<IHHHHHHIIIHHHHHII",
            0x02014B50,
            45,
            45,
            0,
            0,
            0,
            0,
            crc,
            2**32 - 1,
            2**32 - 1,
            len(raw),
            28,
            0,
            0,
            0,
            0,
            2**32 - 1,
        )
        central += raw + extra
    directory, count = len(out), len(entries)
    out += central
    end64 = len(out)
    out += struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, count, count, len(central), directory)
    out += struct.pack("<IIQI", 0x07064B50, 0, end64, 1)
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 2**32 - 1, 2**32 - 1, 0)
    return bytes(out)


def test_zip64_package_runs(host, mlp, mlp_members, tmp_path):
    package = tmp_path / "zip64.aotc"
    package.write_bytes(zip64_of(list(mlp_members.items())))
    x = mlp_input()
    want = python_outputs(package, {"input": x})  # Python's zipfile reads the rewrite too
    assert_ran(run_model(host, package, [x], tmp_path))
    assert np.array_equal(read_outputs(tmp_path, want)["output"], want["output"])


# ----------------------------------------------------------------------------- refusals


def zip_of(entries: dict[str, bytes], deflated: tuple[str, ...] = ()) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in entries.items():
            zf.writestr(
                zipfile.ZipInfo(name), data, zipfile.ZIP_DEFLATED if name in deflated else zipfile.ZIP_STORED
            )
    return buf.getvalue()


def repackaged(
    members: dict[str, bytes],
    edit: Callable[[dict], None] = lambda m: None,
    replaced: dict[str, bytes | None] | None = None,
    deflated: tuple[str, ...] = (),
) -> bytes:
    """The package with members replaced (None: removed from the zip and the manifest) and listed in the
    manifest with their new sha256 and size, and the manifest edited by `edit`."""
    manifest = json.loads(members["manifest.json"])
    entries = dict(members)
    for name, data in (replaced or {}).items():
        if data is None:
            entries.pop(name)
            manifest["members"].pop(name)
        else:
            entries[name] = data
            manifest["members"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    edit(manifest)
    entries["manifest.json"] = json.dumps(manifest, indent=2).encode()
    return zip_of(entries, deflated)


def flipped_weight_byte(package: bytes) -> bytes:
    with zipfile.ZipFile(io.BytesIO(package)) as zf:
        info = zf.getinfo("weights.bin")
    name_len, extra_len = struct.unpack_from("<HH", package, info.header_offset + 26)
    at = info.header_offset + 30 + name_len + extra_len + info.file_size // 2
    return package[:at] + bytes([package[at] ^ 0x10]) + package[at + 1 :]


def plan_with_weight_arg_past_the_end(library: bytes) -> bytes:
    """The library with the last weight argument of its plan moved one byte further: past the weights."""
    plan = json.loads(read_elf(library).section(".aotc_plan").rstrip(b"\0"))
    args = [a for c in plan["execution_plan"] for a in c["args"] if a["kind"] == "weight"]
    last = max(args, key=lambda a: a["offset"] + a["nbytes"])
    text = json.dumps(last, sort_keys=True, separators=(",", ":")).encode()
    moved = text.replace(b'"offset":%d' % last["offset"], b'"offset":%d' % (last["offset"] + 1))
    assert len(moved) == len(text) and library.count(text) == 1
    return library.replace(text, moved)


def gpu_style(manifest: dict) -> None:
    manifest["target"] = "opencl"
    manifest["members"]["plan.json"] = manifest["members"].pop("lib/model.so")


REFUSALS: dict[str, tuple[Callable[[dict, bytes], bytes], int, str]] = {
    "not a zip": (
        lambda m, p: b"this is not a package\n" * 5,
        FORMAT,
        "is not an aotc package (not a zip file)",
    ),
    "empty file": (lambda m, p: b"", FORMAT, "not a zip file"),
    "truncated": (
        lambda m, p: p[: len(p) // 2],
        FORMAT,
        "is truncated or damaged (its zip directory is missing)",
    ),
    "flipped weights byte": (
        lambda m, p: flipped_weight_byte(p),
        CHECKSUM,
        "member weights.bin is corrupted",
    ),
    "weights edited, zip CRC recomputed": (
        lambda m, p: zip_of({**m, "weights.bin": bytes(len(m["weights.bin"]))}),
        CHECKSUM,
        "member weights.bin is corrupted (sha256 mismatch)",
    ),
    "format version 1": (
        lambda m, p: repackaged(m, lambda d: d.update(format_version=1)),
        FORMAT,
        "package format 1 predates plan checks; rebuild it",
    ),
    "format version 3": (
        lambda m, p: repackaged(m, lambda d: d.update(format_version=3)),
        FORMAT,
        "package format version 3 is newer than this runtime supports (2)",
    ),
    "foreign manifest": (
        lambda m, p: repackaged(m, lambda d: d.update(format="something-else")),
        FORMAT,
        'foreign file: manifest.json has format "something-else"',
    ),
    "extra member": (
        lambda m, p: zip_of({**m, "extra.txt": b"hello"}),
        FORMAT,
        "member extra.txt is not listed in manifest.json",
    ),
    "library removed": (
        lambda m, p: repackaged(m, replaced={"lib/model.so": None}),
        FORMAT,
        "manifest.json does not list the member lib/model.so",
    ),
    "listed member missing": (
        lambda m, p: zip_of({k: v for k, v in m.items() if k != "weights.bin"}),
        FORMAT,
        "member weights.bin is missing",
    ),
    "GPU package": (
        lambda m, p: repackaged(m, gpu_style),
        UNSUPPORTED,
        "the C runtime runs CPU packages only",
    ),
    "deflated manifest": (
        lambda m, p: zip_of(m, deflated=("manifest.json",)),
        FORMAT,
        "member manifest.json is compressed (deflate); the C runtime reads stored members only: rebuild",
    ),
    "edited input shape": (
        lambda m, p: repackaged(m, lambda d: d["inputs"][0].update(shape=[1, 65])),
        FORMAT,
        "manifest.json inputs[0].shape is [1,65] but the kernel library was compiled for [1,64]",
    ),
    "library not ELF": (
        lambda m, p: repackaged(m, replaced={"lib/model.so": b"\x7fELG" + bytes(200)}),
        FORMAT,
        "its kernel library lib/model.so is not a well-formed ELF file (it is not an ELF file (bad magic))",
    ),
    "plan argument outside the weights": (
        lambda m, p: repackaged(
            m, replaced={"lib/model.so": plan_with_weight_arg_past_the_end(m["lib/model.so"])}
        ),
        FORMAT,
        "its kernel library's plan is unusable: the plan's execution_plan[",
    ),
    "weights of another size": (
        lambda m, p: repackaged(m, replaced={"weights.bin": m["weights.bin"] + bytes(64)}),
        FORMAT,
        "member weights.bin holds",
    ),
    "format version a float": (  # a float's text once outlived the manifest's bytes (ASan: use after free)
        lambda m, p: repackaged(m, lambda d: d.update(format_version=2.0)),
        FORMAT,
        "manifest.json has an invalid format_version 2.0",
    ),
    "dependency missing": (
        lambda m, p: repackaged(
            m, replaced={"lib/model.so": m["lib/model.so"].replace(b"libm.so.6\0", b"libq.so.6\0")}
        ),
        LIBRARY,
        "libq.so.6: cannot open shared object file",
    ),
}


def write_case(tmp_path: Path, name: str, members: dict[str, bytes], package: bytes) -> Path:
    make, _, _ = REFUSALS[name]
    path = tmp_path / "case.aotc"
    path.write_bytes(make(members, package))
    return path


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_refusal(host, mlp, mlp_members, tmp_path, name):
    _, status, fragment = REFUSALS[name]
    case = write_case(tmp_path, name, mlp_members, mlp.read_bytes())
    assert_refused(run_model(host, case, [mlp_input()], tmp_path), status, fragment)


def test_refusals_of_the_call(host, mlp, tmp_path):
    assert_refused(run_model(host, tmp_path / "absent.aotc", [], tmp_path), IO, "cannot open")
    wrong = np.zeros((1, 65), np.float32)
    assert_refused(run_model(host, mlp, [wrong], tmp_path), INVALID_ARGUMENT, "is 256 bytes, got 260")
    proc = run_model(host, mlp, [mlp_input()], tmp_path, env={"AOTC_REQUIRE_SIGNATURE": "1"})
    assert_refused(proc, UNSUPPORTED, "signature verification is not available in the C runtime")
    proc = run_model(host, mlp, [mlp_input()], tmp_path, env={"AOTC_REQUIRE_SIGNATURE": "maybe"})
    assert_refused(proc, INVALID_ARGUMENT, "AOTC_REQUIRE_SIGNATURE='maybe'")


def with_required_feature(members: dict[str, bytes], old: str, new: str) -> bytes:
    """The package requiring CPU feature `new` instead of `old` (same length), in plan and manifest."""
    library = members["lib/model.so"].replace(f'"{old}"'.encode(), f'"{new}"'.encode())
    requires = lambda d: d.update(requires=[new if f == old else f for f in d["requires"]])  # noqa: E731
    return repackaged(members, requires, replaced={"lib/model.so": library})


def test_cpu_features_checked_against_cpuinfo(host, mlp, mlp_members, tmp_path):
    if '"sse3"' not in json.dumps(plan_of(mlp)["requires"]):
        pytest.skip("the host package requires no sse3 to swap")
    if " fma4" in Path("/proc/cpuinfo").read_text():
        pytest.skip("this host has fma4")
    case = tmp_path / "case.aotc"
    case.write_bytes(with_required_feature(mlp_members, "sse3", "fma4"))
    assert_refused(
        run_model(host, case, [mlp_input()], tmp_path),
        UNSUPPORTED,
        "needs CPU features this host lacks: fma4",
    )
    case.write_bytes(with_required_feature(mlp_members, "sse3", "sse9"))
    assert_refused(
        run_model(host, case, [mlp_input()], tmp_path),
        UNSUPPORTED,
        "requires CPU features this runtime does not know for x86_64: sse9",
    )


def runtime_leaks(stderr: str) -> list[str]:
    """LeakSanitizer's reports but those of the blocks an aotc kernel library caches between calls (its
    kernels' shared temporaries and parallel regions' buffers, from aligned_alloc, not freed when the
    library unloads). The runtime and the example never call aligned_alloc."""
    reports = stderr.split("Direct leak")[1:] + stderr.split("Indirect leak")[1:]
    return [r for r in reports if "aligned_alloc" not in r.split("#0 ", 1)[-1].split("\n", 1)[0]]


def assert_clean(proc: subprocess.CompletedProcess, status: int, case: str) -> None:
    assert proc.returncode == status, (case, proc.stderr)
    assert "ERROR: AddressSanitizer" not in proc.stderr and "runtime error" not in proc.stderr, (
        case,
        proc.stderr,
    )
    assert not runtime_leaks(proc.stderr), (case, proc.stderr)


SANITIZER_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:exitcode=99",
    "LSAN_OPTIONS": "exitcode=0",
    "UBSAN_OPTIONS": "halt_on_error=1",
}


@pytest.fixture(scope="module")
def sanitized(tmp_path_factory) -> Path:
    """The runtime and example built with AddressSanitizer and UBSan."""
    return build_runtime(tmp_path_factory.mktemp("c-runtime-asan"), "SANITIZE=1")


def test_refusals_under_address_sanitizer(sanitized, mlp, mlp_members, tmp_path):
    """Every refusal, a wrong input size and good runs under ASan + UBSan: the same statuses, no memory
    error, no leak of the runtime's."""
    build, env = sanitized, SANITIZER_ENV
    package = mlp.read_bytes()
    for name, (_, status, _) in REFUSALS.items():
        case = write_case(tmp_path, name, mlp_members, package)
        assert_clean(run_model(build, case, [mlp_input()], tmp_path, env=env), status, name)
    wrong = run_model(build, mlp, [np.zeros((1, 63), np.float32)], tmp_path, env=env)
    assert_clean(wrong, INVALID_ARGUMENT, "wrong input size")
    for threads in ("1", "2"):
        good = run_model(build, mlp, [mlp_input()], tmp_path, "--repeat", "5", "--threads", threads, env=env)
        assert_clean(good, 0, f"{threads} threads")


INTERESTING_BYTES = b'"{}[],:\\09- \x00\x7f\x80\xff'


def mutations(package: bytes, members: dict[str, bytes], count: int, seed: int) -> list[tuple[str, bytes]]:
    """Seeded damage to a package, in turn: a byte of the zip directory, of a local header, a truncation
    or junk appended, a byte of manifest.json, a byte of the library's section headers or plan (the
    manifest then listing the edited library's sha256, so that the ELF and plan checks see it)."""
    rng = np.random.default_rng(seed)
    with zipfile.ZipFile(io.BytesIO(package)) as zf:
        infos, directory = zf.infolist(), zf.start_dir
    library = members["lib/model.so"]
    (shoff,), (shnum,) = struct.unpack_from("<Q", library, 0x28), struct.unpack_from("<H", library, 0x3C)
    plan = next(s for s in read_elf(library).sections if s.name == ".aotc_plan")

    def flip(data: bytes, lo: int, hi: int) -> bytes:
        at = int(rng.integers(lo, hi))
        value = int(rng.choice(list(INTERESTING_BYTES))) if rng.random() < 0.5 else int(rng.integers(256))
        return data[:at] + bytes([value if value != data[at] else data[at] ^ 1]) + data[at + 1 :]

    cases = []
    for i in range(count):
        kind = i % 5
        if kind == 0:
            cases.append(("zip directory", flip(package, directory, len(package))))
        elif kind == 1:
            info = infos[int(rng.integers(len(infos)))]
            end = info.header_offset + 30 + len(info.filename)
            cases.append((f"local header of {info.filename}", flip(package, info.header_offset, end)))
        elif kind == 2:
            cut = int(rng.integers(len(package)))
            cases.append(
                ("truncated", package[:cut]) if i % 2 else ("junk appended", package + package[:cut])
            )
        elif kind == 3:
            manifest = members["manifest.json"]
            cases.append(("manifest", zip_of({**members, "manifest.json": flip(manifest, 0, len(manifest))})))
        else:
            lo, hi = (shoff, shoff + 64 * shnum) if i % 2 else (plan.offset, plan.offset + plan.size)
            edited = flip(library, lo, hi)
            cases.append(
                (
                    "library sections" if i % 2 else "plan",
                    repackaged(members, replaced={"lib/model.so": edited}),
                )
            )
    return cases


def test_mutated_packages_under_address_sanitizer(sanitized, mlp, mlp_members, tmp_path):
    """Every mutation ends in a runtime status (never a signal or a sanitizer report), and the C runtime
    accepts nothing the Python runtime refuses: what it runs, read_package accepts, with the same outputs."""
    x = mlp_input()
    baseline = python_outputs(mlp, {"input": x})["output"]
    for i, (what, data) in enumerate(mutations(mlp.read_bytes(), mlp_members, 150, seed=22)):
        case = tmp_path / "case.aotc"
        case.write_bytes(data)
        proc = run_model(sanitized, case, [x], tmp_path, env=SANITIZER_ENV)
        assert proc.returncode in range(9), (i, what, proc.returncode, proc.stderr)
        assert "ERROR: AddressSanitizer" not in proc.stderr and "runtime error" not in proc.stderr, (
            i,
            what,
            proc.stderr,
        )
        assert not runtime_leaks(proc.stderr), (i, what, proc.stderr)
        if what in ("plan", "truncated"):  # any change to the plan differs from the manifest
            assert proc.returncode == FORMAT, (i, what, proc.stderr)
        if proc.returncode == 0:  # a harmless change: an unused zip field, manifest whitespace, ...
            read_package(str(case))  # a PackageError here: C ran what Python refuses
            assert np.array_equal(
                np.fromfile(tmp_path / "out" / "output.bin", np.float32), baseline.ravel()
            ), (i, what)


# ----------------------------------------------------------------------------- large inputs

ELF_SECTION = struct.Struct("<IIQQQQIIQQ")
SHT_PROGBITS, SHT_STRTAB, SHT_DYNSYM = 1, 3, 11
SHF_ALLOC_EXECINSTR = 0x2 | 0x4


def elf_of(machine: int, sections: list[tuple[str, int, int, bytes, int, int]]) -> bytes:
    """A 64-bit little-endian ELF file of nothing but section headers (name, type, flags, bytes, link,
    entry size; section i of the list is section i + 1) and their name table: what the runtime reads
    before loading a library, enough to reach each check (dlopen would refuse it)."""
    names, body, headers = bytearray(b"\0"), bytearray(64), bytearray(ELF_SECTION.size)
    for name, kind, flags, data, link, entsize in [*sections, (".shstrtab", SHT_STRTAB, 0, b"", 0, 0)]:
        name_at = len(names)
        names += name.encode() + b"\0"
        if name == ".shstrtab":
            data = bytes(names)
        headers += ELF_SECTION.pack(name_at, kind, flags, 0, len(body), len(data), link, 0, 1, entsize)
        body += data
    body += bytes(-len(body) % 8)
    count = len(sections) + 2
    ident = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    body[:64] = ident + struct.pack(
        "<HHIQQQIHHHHHH", 3, machine, 1, 0, 0, len(body), 0, 64, 0, 0, 64, count, count - 1
    )
    return bytes(body + headers)


def sections_of_one_name(machine: int, count: int, name_length: int) -> bytes:
    """An ELF file of `count` empty sections all named by offset 0 of one name table, whose only string is
    `name_length` bytes long: each check of a name once read the table to its end."""
    names = b"." + b"a" * (name_length - 1) + b"\0"
    body = bytearray(64) + names + bytes(-(64 + len(names)) % 8)
    headers = ELF_SECTION.pack(0, 0, 0, 0, 0, count, 0, 0, 0, 0)  # e_shnum 0: the count is here
    headers += ELF_SECTION.pack(0, SHT_STRTAB, 0, 0, 64, len(names), 0, 0, 1, 0)
    headers += ELF_SECTION.pack(0, SHT_PROGBITS, 0, 0, 64, 0, 0, 0, 1, 0) * (count - 2)
    ident = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    body[:64] = ident + struct.pack("<HHIQQQIHHHHHH", 3, machine, 1, 0, 0, len(body), 0, 64, 0, 0, 64, 0, 1)
    return bytes(body + headers)


def dynamic_functions(names: list[str]) -> list[tuple[str, int, int, bytes, int, int]]:
    """.text, .dynsym exporting each of `names` as a global function in it, and .dynstr."""
    strings, symbols = bytearray(b"\0"), bytearray(24)
    for name in names:
        symbols += struct.pack("<IBBHQQ", len(strings), 0x12, 0, 1, 0, 1)  # STB_GLOBAL, STT_FUNC, in .text
        strings += name.encode() + b"\0"
    return [
        (".text", SHT_PROGBITS, SHF_ALLOC_EXECINSTR, b"\xc3", 0, 0),
        (".dynsym", SHT_DYNSYM, 0x2, bytes(symbols), 3, 24),
        (".dynstr", SHT_STRTAB, 0x2, bytes(strings), 0, 0),
    ]


def with_plan(members: dict[str, bytes], plan: dict, exported: list[str] | None = None) -> bytes:
    """The package with a library of `plan` (canonical, in .aotc_plan) exporting `exported`, and the
    manifest describing that plan as aotc writes it; weights.bin as large as the plan says."""
    (machine,) = struct.unpack_from("<H", members["lib/model.so"], 18)
    text = json.dumps(plan, sort_keys=True, separators=(",", ":")).encode() + b"\0"
    sections = dynamic_functions(exported or [])
    library = elf_of(machine, [*sections, (".aotc_plan", SHT_PROGBITS, 0x2, text, 0, 0)])

    def describe(manifest: dict) -> None:
        for key in ("entry", "target", "triple", "requires", "inputs", "outputs", "execution_plan"):
            manifest[key] = plan[key]
        manifest["memory_plan"]["workspace_bytes"] = plan["workspace_bytes"]
        manifest["weights"] = {"nbytes": plan["weights_nbytes"], "tensors": []}
        manifest["kernels"] = [{"symbol": k["symbol"], "params": []} for k in plan["kernels"]]

    weights = bytes(plan["weights_nbytes"])
    return repackaged(members, describe, replaced={"lib/model.so": library, "weights.bin": weights})


def plain_plan(members: dict[str, bytes], **fields) -> dict:
    """A version 1 plan of no inputs, outputs, weights or calls, for the host, with `fields` replaced."""
    manifest = json.loads(members["manifest.json"])
    plan = {
        "plan_version": 1,
        "entry": "aotc_run",
        "target": manifest["target"],
        "triple": manifest["triple"],
        "requires": [],
        "inputs": [],
        "outputs": [],
        "workspace_bytes": 0,
        "weights_nbytes": 0,
        "kernels": [],
        "execution_plan": [],
    }
    return {**plan, **fields}


RUNTIME_FUNCTIONS = ["aotc_get_max_threads", "aotc_set_num_threads", "aotc_set_call_threads"]
MANY = 300_000  # comparing every pair of these took minutes to hours; sorting, well under a second

LARGE_INPUTS: dict[str, tuple[Callable[[dict], bytes], int, str]] = {
    "a manifest object of many keys": (  # and runs: provenance is informational
        lambda m: repackaged(m, lambda d: d.update(provenance={f"k{i}": i for i in range(MANY)})),
        0,
        "",
    ),
    "a plan of many kernels": (
        lambda m: with_plan(
            m,
            plain_plan(m, kernels=[{"symbol": f"k{i}", "params": []} for i in range(MANY)]),
            ["aotc_run", *RUNTIME_FUNCTIONS, *(f"k{i}" for i in range(MANY - 1))],
        ),
        FORMAT,
        f"its kernel library does not define k{MANY - 1}, which the plan calls",
    ),
    "sections sharing a name of megabytes": (
        lambda m: repackaged(
            m,
            replaced={
                "lib/model.so": sections_of_one_name(
                    struct.unpack_from("<H", m["lib/model.so"], 18)[0], 50_000, 4 << 20
                )
            },
        ),
        FORMAT,
        "the name of section 1 is not an ASCII string of at most 4096 bytes",
    ),
    "a plan of many inputs": (
        lambda m: with_plan(
            m,
            plain_plan(m, inputs=[{"dtype": "int8", "name": f"x{i}", "shape": [1]} for i in range(MANY)]),
            ["aotc_run", *RUNTIME_FUNCTIONS],
        ),
        LIBRARY,
        "cannot load its kernel library lib/model.so",
    ),
}


@pytest.mark.parametrize("name", sorted(LARGE_INPUTS))
def test_large_inputs_are_checked_in_time(host, mlp_members, tmp_path, name):
    """Duplicate keys, kernels, names and the library's exported functions are found by sorting, and a
    section or symbol name is read to at most 4096 bytes: a package of 300,000 of them (a few MB) is
    checked in well under the time limit, to its first failing check (the synthetic library of many inputs
    passes every check before dlopen, which refuses it)."""
    make, status, fragment = LARGE_INPUTS[name]
    case = tmp_path / "case.aotc"
    case.write_bytes(make(mlp_members))
    mlp_input().tofile(tmp_path / "x.bin")
    command = [str(host / "run_model"), str(case), str(tmp_path / "x.bin"), "-o", str(tmp_path / "out")]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert_refused(proc, status, fragment)


# ----------------------------------------------------------------------------- the C API

API_CHECK = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "aotc_runtime.h"

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "line %d: %s [%s]\n", __LINE__, #c, aotc_last_error()); exit(1); } } while (0)

static float x[64], y[10], expected[10];

static void *load(const char *path, size_t n) {
    void *p = malloc(n);
    FILE *f = fopen(path, "rb");
    CHECK(f && fread(p, 1, n, f) == n);
    fclose(f);
    return p;
}

static int run(aotc_model *m, const void *in, size_t in_n, void *out, size_t out_n) {
    const void *ins[] = {in};
    void *outs[] = {out};
    return aotc_model_run(m, 0, ins, &in_n, outs, &out_n);
}

static void *runs(void *model) {
    float mine[10];
    for (int i = 0; i < 200; i++) {
        CHECK(run(model, x, sizeof x, mine, sizeof mine) == AOTC_OK);
        CHECK(memcmp(mine, expected, sizeof mine) == 0);
    }
    return NULL;
}

/* the fd of the model's memfd (its library's file), found in /proc/self/fd */
static int memfd(void) {
    char link[64], target[256];
    for (int fd = 3; fd < 1024; fd++) {
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, target, sizeof target - 1);
        if (n > 0 && (target[n] = 0, strstr(target, "aotc-model")))
            return fd;
    }
    return -1;
}

int main(int argc, char **argv) {
    /* argv: mlp package, its input, its output; cnn package, its input, its output */
    (void)argc;
    aotc_model *m = (aotc_model *)&m, *c;
    memcpy(x, load(argv[2], sizeof x), sizeof x);
    memcpy(expected, load(argv[3], sizeof expected), sizeof expected);
    CHECK(aotc_model_open(argv[1], NULL, NULL) == AOTC_ERR_INVALID_ARGUMENT);
    CHECK(aotc_model_open(NULL, NULL, &m) == AOTC_ERR_INVALID_ARGUMENT && m == NULL);
    aotc_open_options options = {0};
    options.num_threads = 100000;
    CHECK(aotc_model_open(argv[1], &options, &m) == AOTC_ERR_INVALID_ARGUMENT && strstr(aotc_last_error(), "num_threads"));
    options.num_threads = 0;
    options.require_signature = 1;
    CHECK(aotc_model_open(argv[1], &options, &m) == AOTC_ERR_UNSUPPORTED && strstr(aotc_last_error(), "verify"));
    CHECK(aotc_model_open(argv[1], NULL, &m) == AOTC_OK);
    CHECK(!strcmp(aotc_model_name(m), "mlp") && strlen(aotc_model_digest(m)) == 64 && aotc_model_target(m));
    CHECK(aotc_model_num_variants(m) == 1 && aotc_model_num_inputs(m, 0) == 1 && aotc_model_num_outputs(m, 0) == 1);
    CHECK(aotc_model_num_inputs(m, 1) == -1 && strstr(aotc_last_error(), "variant 1 does not exist"));
    CHECK(aotc_model_input(m, 0, 1) == NULL && strstr(aotc_last_error(), "index 1 does not exist"));
    CHECK(aotc_model_output(NULL, 0, 0) == NULL && aotc_model_num_variants(NULL) == -1);
    const aotc_tensor_info *in = aotc_model_input(m, 0, 0), *out = aotc_model_output(m, 0, 0);
    CHECK(!strcmp(in->name, "input") && !strcmp(in->dtype, "float32") && in->itemsize == 4 && in->rank == 2);
    CHECK(in->shape[0] == 1 && in->shape[1] == 64 && in->nbytes == 256 && out->nbytes == 40);
    size_t in_n = 256, out_n = 40;
    const void *ins[] = {x};
    void *outs[] = {y};
    CHECK(aotc_model_run(m, 0, NULL, &in_n, outs, &out_n) == AOTC_ERR_INVALID_ARGUMENT);
    CHECK(aotc_model_run(m, 0, ins, &in_n, NULL, &out_n) == AOTC_ERR_INVALID_ARGUMENT);
    CHECK(aotc_model_run(m, 1, ins, &in_n, outs, &out_n) == AOTC_ERR_INVALID_ARGUMENT);
    CHECK(run(m, x, 255, y, 40) == AOTC_ERR_INVALID_ARGUMENT && strstr(aotc_last_error(), "is 256 bytes, got 255"));
    CHECK(run(m, NULL, 256, y, 40) == AOTC_ERR_INVALID_ARGUMENT && strstr(aotc_last_error(), "is NULL"));
    CHECK(run(m, (char *)x + 2, 256, y, 40) == AOTC_ERR_INVALID_ARGUMENT && strstr(aotc_last_error(), "aligned"));
    CHECK(run(m, x, 256, x + 8, 40) == AOTC_ERR_INVALID_ARGUMENT && strstr(aotc_last_error(), "overlaps input 'input'"));
    CHECK(aotc_model_set_num_threads(m, -1) == AOTC_ERR_INVALID_ARGUMENT);
    CHECK(aotc_model_set_num_threads(m, 1) == AOTC_OK && aotc_model_num_threads(m) == 1);
    CHECK(run(m, x, 256, y, 40) == AOTC_OK && memcmp(y, expected, sizeof y) == 0);
    CHECK(aotc_model_set_num_threads(m, 0) == AOTC_OK && aotc_model_num_threads(m) >= 1);

    /* concurrent runs of one model wait for each other (one workspace) and all get the right output */
    pthread_t threads[3];
    for (int i = 0; i < 3; i++)
        CHECK(pthread_create(&threads[i], NULL, runs, m) == 0);
    for (int i = 0; i < 3; i++)
        pthread_join(threads[i], NULL);

    /* glibc knows a loaded library by its name /proc/self/fd/N: keep the mlp's library loaded after its
     * model closes, so that the next model's memfd, given the same number, must move to another */
    int fd = memfd();
    char name[64];
    snprintf(name, sizeof name, "/proc/self/fd/%d", fd);
    void *held = dlopen(name, RTLD_NOW | RTLD_NOLOAD);
    CHECK(fd >= 0 && held);
    aotc_model_close(m);
    CHECK(aotc_model_open(argv[4], NULL, &c) == AOTC_OK);
    size_t cnn_in = aotc_model_input(c, 0, 0)->nbytes, cnn_out = aotc_model_output(c, 0, 0)->nbytes;
    void *cx = load(argv[5], cnn_in), *cy = malloc(cnn_out), *cwant = load(argv[6], cnn_out);
    CHECK(run(c, cx, cnn_in, cy, cnn_out) == AOTC_OK && memcmp(cy, cwant, cnn_out) == 0);
    aotc_model_close(c);
    dlclose(held);
    aotc_model_close(NULL);
    CHECK(!strcmp(aotc_status_name(AOTC_ERR_CHECKSUM), "AOTC_ERR_CHECKSUM"));
    CHECK(!strcmp(aotc_status_name((aotc_status)99), "AOTC_ERR_UNKNOWN"));
    puts("api ok");
    return 0;
}
"""


def compile_c_program(program: Path, source: Path, *link: str) -> None:
    """`source` compiled as strict C99 against the runtime's header and linked with `link`."""
    cmd = ["cc", "-std=c99", "-Wall", "-Werror", "-I", str(C_RUNTIME), "-o", str(program), str(source)]
    subprocess.run([*cmd, *link, "-ldl", "-lpthread"], check=True)


def test_c_api(host, mlp, cnn, tmp_path):
    """The API's argument checks, concurrent runs of one model, and a model loaded while another
    package's library still holds the /proc/self/fd name its memfd gets; linked to the shared library."""
    source = tmp_path / "api_check.c"
    source.write_text(API_CHECK)
    program = tmp_path / "api_check"
    compile_c_program(program, source, f"-L{host}", "-laotc_runtime", f"-Wl,-rpath,{host}")
    x = mlp_input()
    cx = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype("float32")
    files = []
    for name, array in (
        ("x", x),
        ("y", python_outputs(mlp, {"input": x})["output"]),
        ("cx", cx),
        ("cy", python_outputs(cnn, {"input": cx})["output"]),
    ):
        array.tofile(tmp_path / f"{name}.bin")
        files.append(str(tmp_path / f"{name}.bin"))
    proc = subprocess.run(
        [str(program), str(mlp), *files[:2], str(cnn), *files[2:]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "api ok" in proc.stdout, proc.stderr


def test_docs_example_compiles_and_runs(host, mlp, tmp_path):
    """The complete example of docs/c-runtime.md, compiled against the static library as it says."""
    text = (REPO / "docs" / "c-runtime.md").read_text()
    source = text.split("```c\n", 1)[1].split("```", 1)[0]
    (tmp_path / "classify.c").write_text(source)
    program = tmp_path / "classify"
    compile_c_program(program, tmp_path / "classify.c", str(host / "libaotc_runtime.a"))
    x = mlp_input()
    x.tofile(tmp_path / "x.bin")
    proc = subprocess.run([str(program), str(mlp), str(tmp_path / "x.bin")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    printed = np.array([float(line.split(" = ")[1]) for line in proc.stdout.splitlines()], np.float32)
    assert np.array_equal(printed, python_outputs(mlp, {"input": x})["output"].ravel())  # %.9g: exact
    x[:, :10].tofile(tmp_path / "short.bin")
    proc = subprocess.run(
        [str(program), str(mlp), str(tmp_path / "short.bin")], capture_output=True, text=True
    )
    assert proc.returncode == INVALID_ARGUMENT and "is 256 bytes, got 40" in proc.stderr


# ----------------------------------------------------------------------------- AArch64 under qemu


@pytest.fixture(scope="module")
def aarch64(tmp_path_factory) -> Path:
    return build_runtime(tmp_path_factory.mktemp("c-runtime-aarch64"), "ARCH=aarch64")


def qemu(cpu: str) -> list[str]:
    return ["qemu-aarch64", "-L", SYSROOT, "-cpu", cpu]


@needs_aarch64
def test_aarch64_runtime_under_qemu_matches_the_host(aarch64, host, mlp, packages, tmp_path):
    """The runtime cross-built for AArch64 runs a cortex-a72 MLP under qemu to the host package's outputs
    (another ISA: close, not bit-exact); a wrong input size is refused there too, and the same package
    on this x86 host names its architecture."""
    package = compile_package(packages, models.mlp(), "mlp_a72", CORTEX_A72)
    x = mlp_input()
    want = python_outputs(mlp, {"input": x})
    assert_ran(run_model(aarch64, package, [x], tmp_path, emulate=qemu("cortex-a72")))
    np.testing.assert_allclose(read_outputs(tmp_path, want)["output"], want["output"], rtol=1e-5, atol=1e-6)
    proc = run_model(aarch64, package, [np.zeros((2, 64), np.float32)], tmp_path, emulate=qemu("cortex-a72"))
    assert_refused(proc, INVALID_ARGUMENT, "is 256 bytes, got 512")
    if os.uname().machine == "x86_64":
        assert_refused(run_model(host, package, [x], tmp_path), UNSUPPORTED, "was compiled for aarch64")


@needs_aarch64
def test_aarch64_features_read_from_hwcap(aarch64, packages, tmp_path):
    """A neoverse-n1 package needs LSE, RCpc, FP16 and dot product, which qemu's cortex-a72 lacks: the
    runtime reads AT_HWCAP (under qemu /proc/cpuinfo describes the x86 host)."""
    package = compile_package(packages, models.mlp(), "mlp_n1", NEOVERSE_N1)
    proc = run_model(aarch64, package, [mlp_input()], tmp_path, emulate=qemu("cortex-a72"))
    assert_refused(proc, UNSUPPORTED, "needs CPU features this host lacks:")
    assert "lse" in proc.stderr and "dotprod" in proc.stderr
    assert_ran(run_model(aarch64, package, [mlp_input()], tmp_path, emulate=qemu("neoverse-n1")))


def test_python_runtime_reads_elf_names_in_bounded_time():
    """The Python runtime's ELF reader bounds a name as the C runtime does: 50,000 sections all named by
    one 4 MB string without a NUL are refused at once, not read to the table's end 50,000 times."""
    import time

    from aotc_runtime.elf import ElfError

    data = sections_of_one_name(62, 50_000, 4 << 20)
    start = time.perf_counter()
    with pytest.raises(ElfError, match="not NUL-terminated within 4096 bytes"):
        read_elf(data)
    assert time.perf_counter() - start < 10
