"""Running another CPU architecture's code on this host under qemu-user (docs/targets.md#emulation).

Two things run emulated: single kernels while tuning (the search's emulated runner, with a small C
driver and the cross toolchain's libc) and whole packages when a build or `aotc run/validate
--emulate` checks one, through `aotc_runtime` in that architecture's own Python. That Python lives in
a folder made once with `mmdebstrap --variant=extract` from Debian's archive (about 110 MB) and kept
in the user's cache. Timings under qemu say nothing about the device.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from aotc.target import Target


@dataclass(frozen=True)
class Emulator:
    """How this host runs one architecture's Linux code: qemu-user, the cross C compiler (the search's
    kernel driver) and its libc folder (`qemu -L`), and the Debian name of the architecture."""

    qemu: str
    cross_gcc: str
    libc_root: str
    debian_arch: str
    apt_packages: str  # what installs the first three


EMULATORS = {
    "aarch64": Emulator(
        "qemu-aarch64",
        "aarch64-linux-gnu-gcc",
        "/usr/aarch64-linux-gnu",
        "arm64",
        "qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross",
    ),
    "arm": Emulator(
        "qemu-arm",
        "arm-linux-gnueabihf-gcc",
        "/usr/arm-linux-gnueabihf",
        "armhf",
        "qemu-user gcc-arm-linux-gnueabihf libc6-dev-armhf-cross",
    ),
}
# The emulated Python: Debian's, with numpy (all aotc_runtime needs), from the release these machines run.
SYSROOT_SUITE = "bookworm"
SYSROOT_PACKAGES = ("python3-minimal", "libpython3.11-stdlib", "python3-numpy")
SYSROOT_PYTHON = "usr/bin/python3.11"
# The release's main archive alone: its security and updates mirrors add nothing the check needs, and a
# mirror mid-sync fails the whole make ("File has unexpected size"). `AOTC_DEBIAN_MIRROR` names another.
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Debian's numpy finds BLAS and LAPACK through alternatives, which an extracted folder never set up: the
# links their maintainer scripts would make (LD_LIBRARY_PATH does not serve: qemu-arm 7.2 does not
# redirect the loader's statx of a directory into the folder, so it skips the directory as missing).
_ALTERNATIVES = ("blas/libblas.so.3", "lapack/liblapack.so.3")
_DEBIAN_TRIPLES = {"arm64": "aarch64-linux-gnu", "armhf": "arm-linux-gnueabihf"}
# A package run emulated: Python starts in ~4 s under qemu, numpy and the model take the rest.
PACKAGE_RUN_TIMEOUT_S = 600

log = logging.getLogger("aotc.emulator")


class EmulationError(RuntimeError):
    """An emulated run failed or could not start; the message says what and why."""


class EmulatorUnavailable(EmulationError):
    """This host cannot run the emulated Python (it could not be made); the message says why."""


def qemu_cpu(target: Target) -> str:
    """The qemu CPU model for a target: its -mcpu, so instructions the CPU lacks fault as on the device
    (qemu's default accepts every instruction); `max` for a generic target."""
    return target.mcpu if target.mcpu not in ("", "generic", "native") else "max"


def kernel_emulation_unavailable(target: Target) -> str | None:
    """Why this host cannot run single kernels for `target` under qemu (the search's runner), or None."""
    emulator = EMULATORS.get(target.isa)
    if emulator is None:
        return f"no emulator is known for {target.isa}"
    missing = [p for p in (emulator.qemu, emulator.cross_gcc) if shutil.which(p) is None]
    if missing or not os.path.isdir(emulator.libc_root):
        what = ", ".join(missing) if missing else emulator.libc_root
        return f"{what} is missing (apt-get install {emulator.apt_packages})"
    return None


def package_emulation_unavailable(target: Target) -> str | None:
    """Why this host cannot run a whole package for `target` under qemu, or None. Making the emulated
    Python the first time needs mmdebstrap and Debian's archive."""
    why = kernel_emulation_unavailable(target)
    if why is not None:
        return why
    if _sysroot_ready(sysroot_dir(target.isa)) or shutil.which("mmdebstrap") is not None:
        return None
    return f"making the emulated {target.isa} Python needs mmdebstrap (apt-get install mmdebstrap)"


# ----------------------------------------------------------------------------- the emulated Python


def sysroot_dir(arch: str) -> Path:
    """`$AOTC_SYSROOT_<ARCH>` if set, else `<cache>/aotc/sysroots/<arch>-<suite>-<hash of the packages>`
    (`<cache>/aotc` is `$AOTC_HOME` where that is set, as for the tophub store)."""
    override = os.environ.get(f"AOTC_SYSROOT_{arch.upper()}")
    if override:
        return Path(override)
    home = os.environ.get("AOTC_HOME")
    if home:
        base = Path(home)
    else:
        cache = os.environ.get("XDG_CACHE_HOME")
        base = (Path(cache) if cache else Path.home() / ".cache") / "aotc"
    key = hashlib.sha256(" ".join((SYSROOT_SUITE, *SYSROOT_PACKAGES)).encode()).hexdigest()[:12]
    return base / "sysroots" / f"{arch}-{SYSROOT_SUITE}-{key}"


def _sysroot_ready(path: Path) -> bool:
    return (path / SYSROOT_PYTHON).is_file() and (path / ".aotc-complete").is_file()


def ensure_sysroot(arch: str) -> Path:
    """The folder with `arch`'s Debian Python and numpy, made with mmdebstrap the first time (about 110 MB
    from Debian's archive) into a temporary folder renamed into place, so a failed or concurrent make
    never leaves half a folder behind."""
    path = sysroot_dir(arch)
    if _sysroot_ready(path):
        return path
    if path.exists():  # never replace a folder this did not make
        raise EmulatorUnavailable(
            f"{path} holds no complete emulated {arch} Python; remove it to have it made again"
        )
    if shutil.which("mmdebstrap") is None:
        raise EmulatorUnavailable(
            f"making the emulated {arch} Python needs mmdebstrap (apt-get install mmdebstrap)"
        )
    emulator = EMULATORS[arch]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    log.warning(f"making the emulated {arch} Python in {path} (once, about 110 MB from Debian's archive)")
    cmd = [
        "mmdebstrap",
        "--variant=extract",
        f"--architectures={emulator.debian_arch}",
        f"--include={','.join(SYSROOT_PACKAGES)}",
        SYSROOT_SUITE,
        str(tmp),
        os.environ.get("AOTC_DEBIAN_MIRROR") or DEFAULT_MIRROR,
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
            raise EmulatorUnavailable(f"mmdebstrap could not make the emulated {arch} Python:\n{tail}")
        _link_alternatives(tmp, _DEBIAN_TRIPLES[emulator.debian_arch])
        (tmp / ".aotc-complete").write_text(" ".join(cmd) + "\n")
        try:
            os.rename(tmp, path)
        except OSError:
            if not _sysroot_ready(path):  # another process finished first: use its folder
                raise
    except subprocess.TimeoutExpired as e:
        raise EmulatorUnavailable(
            f"mmdebstrap took more than {e.timeout:g} s making the emulated {arch} Python"
        ) from e
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def _link_alternatives(root: Path, triple: str) -> None:
    libdir = root / "usr" / "lib" / triple
    for target in _ALTERNATIVES:
        link = libdir / os.path.basename(target)
        if (libdir / target).exists() and not link.exists():
            link.symlink_to(target)


# ----------------------------------------------------------------------------- packages under qemu


@dataclass(frozen=True)
class EmulatedTensor:
    name: str
    shape: tuple[int, ...]
    dtype: str


class EmulatedModel:
    """A CPU package of another architecture, run under qemu by `aotc_runtime` in that architecture's
    Python (`python -m aotc_runtime run`), one fresh process per `run`. The package is verified here
    first (checksums, plan, signature policy); the emulated runtime checks it again for its own CPU.
    `run` takes and returns what `CompiledModel.run` does, so validation treats both alike."""

    def __init__(
        self,
        path: str | os.PathLike,
        target: Target,
        trusted_keys=None,
        require_signature: bool | None = None,
        num_threads: int | None = None,
    ) -> None:
        import aotc_runtime
        from aotc_runtime.signing import check_signature

        why = package_emulation_unavailable(target)
        if why is not None:
            raise EmulationError(f"cannot run {path} under qemu: {why}")
        self.path = str(path)
        verified = aotc_runtime.verify_package(self.path)
        check_signature(
            verified.signature, verified.digest, "package", self.path, trusted_keys, require_signature
        )
        self.manifest = verified.manifest
        self.variants = [
            [EmulatedTensor(t.name, tuple(t.shape), t.dtype) for t in v.inputs]
            for v in verified.plan.variants
        ]
        self.inputs = self.variants[0]
        self.target = target
        self.num_threads = num_threads
        self.emulator = EMULATORS[target.isa]
        self.sysroot = ensure_sysroot(target.isa)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        import aotc_runtime

        with tempfile.TemporaryDirectory(prefix="aotc-emulated-") as tmp:
            # A copy of the runtime's sources, so the emulated Python imports nothing of this host's
            # site-packages (where numpy is this host's build).
            shutil.copytree(
                Path(aotc_runtime.__file__).parent,
                Path(tmp, "python", "aotc_runtime"),
                ignore=shutil.ignore_patterns("__pycache__"),
            )
            inputs_file, outputs_file = os.path.join(tmp, "inputs.npz"), os.path.join(tmp, "outputs.npz")
            np.savez(inputs_file, **{name: np.asarray(value) for name, value in inputs.items()})
            cmd = [
                self.emulator.qemu,
                "-L",
                str(self.sysroot),
                "-cpu",
                qemu_cpu(self.target),
                str(self.sysroot / SYSROOT_PYTHON),
                "-m",
                "aotc_runtime",
                "run",
                self.path,
                inputs_file,
                outputs_file,
            ]
            if self.num_threads is not None:
                cmd += ["--threads", str(self.num_threads)]
            try:
                proc = subprocess.run(
                    cmd,
                    env=self._environment(tmp),
                    capture_output=True,
                    text=True,
                    timeout=PACKAGE_RUN_TIMEOUT_S,
                )
            except subprocess.TimeoutExpired as e:
                raise EmulationError(f"{self.path} under qemu took more than {e.timeout:g} s") from e
            if proc.returncode != 0:
                tail = "\n".join((proc.stderr.strip() or f"exit status {proc.returncode}").splitlines()[-8:])
                raise EmulationError(
                    f"{self.path} failed under {self.emulator.qemu} -cpu {qemu_cpu(self.target)}:\n{tail}"
                )
            with np.load(outputs_file, allow_pickle=False) as data:
                return {name: data[name] for name in data.files}

    def _environment(self, tmp: str) -> dict[str, str]:
        """A clean environment: the host's PYTHONPATH or virtualenv must not reach the emulated Python."""
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": os.environ.get("HOME", tmp),
            "LANG": "C.UTF-8",
            "PYTHONPATH": os.path.join(tmp, "python"),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        for name in ("AOTC_RUNTIME_CACHE", "XDG_CACHE_HOME", "OPENBLAS_NUM_THREADS"):
            if name in os.environ:
                env[name] = os.environ[name]
        return env
