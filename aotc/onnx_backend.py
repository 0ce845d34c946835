"""aotc as an ONNX backend (`onnx.backend.base.Backend`), so ONNX's own conformance suite
(`onnx.backend.test.BackendTest`) and any tool written against that interface can drive it.

    from aotc.onnx_backend import AotcBackend
    rep = AotcBackend.prepare(model)          # builds the package (untuned, no validation)
    outputs = rep.run([x, y])                 # runs it with aotc_runtime, outputs in graph order

A build goes through the public path a user takes (`aotc.compile`, then `aotc_runtime.load`). Builds are
cached on disk, keyed by the model's bytes, its input shapes and dtypes, the target and a digest of aotc's
own files, so a second run of the same model loads the package it built before.

A model that feeds a value aotc needs at compile time (the axes of a reduction, the pads of a Pad, a
Reshape's shape: `aotc.frontend.onnx.RunTimeValueError`) as a graph input is built at each `run` with the
values given to those inputs as the build's `constants`, and cached by those values too.

What aotc cannot compile is refused with one of `REFUSALS` (the frontend's errors, which name the node, the
operator and the reason; `BuildError`): a caller tells a refusal from a bug (any other exception) by type.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from aotc.errors import BuildError
from aotc.files import write_atomic
from aotc.frontend.errors import FrontendError
from aotc.frontend.onnx import RunTimeValueError
from aotc.recipe import DEFAULT_TARGET, InputSpec

__all__ = [
    "REFUSALS",
    "AotcBackend",
    "AotcBackendRep",
    "backend_cache_dir",
    "prepare",
    "run_model",
    "supports_device",
]

REFUSALS: tuple[type[Exception], ...] = (FrontendError, BuildError)
"""What aotc raises for a model it cannot compile; any other exception from `prepare` or `run` is a bug."""

Shapes = tuple[tuple[str, tuple[int, ...], str], ...]
Constants = tuple[tuple[str, str, tuple[int, ...], bytes], ...]
"""Graph inputs built as constants: (name, dtype, shape, the values' bytes), in graph-input order."""


def backend_cache_dir() -> Path:
    """$AOTC_ONNX_BACKEND_CACHE, else `onnx-backend` beside the user's record store (`$AOTC_HOME`,
    else `~/.cache/aotc`)."""
    override = os.environ.get("AOTC_ONNX_BACKEND_CACHE")
    if override:
        return Path(override)
    from aotc.hub.store import user_store_dir

    return user_store_dir().parent / "onnx-backend"


KEEP_SOURCES = 3
"""How many source versions' builds a cache directory keeps (the most recently used)."""


def source_cache(cache_dir: Path) -> Path:
    """The directory of this aotc source's builds in `cache_dir`; on first use, builds of all but the
    KEEP_SOURCES most recently used other sources are removed (each edit of aotc starts a new one)."""
    directory = cache_dir / source_digest()[:24]
    if not directory.is_dir():
        directory.mkdir(parents=True, exist_ok=True)
        others = [d for d in cache_dir.iterdir() if _is_source_dir(d) and d != directory]
        for old in sorted(others, key=lambda d: d.stat().st_mtime)[: max(len(others) - KEEP_SOURCES + 1, 0)]:
            shutil.rmtree(old, ignore_errors=True)
    os.utime(directory)  # used now
    return directory


def _is_source_dir(path: Path) -> bool:
    """A directory `source_cache` made (the only ones it removes, whatever else the directory holds)."""
    return path.is_dir() and len(path.name) == 24 and all(c in "0123456789abcdef" for c in path.name)


@functools.cache
def source_digest() -> str:
    """A digest of aotc's version and every file of the installed package: a cached build is reused only
    by the code that made it (an edited checkout gets new builds)."""
    import aotc

    root = Path(aotc.__file__).parent
    h = hashlib.sha256(aotc.__version__.encode())
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _runtime_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs a run feeds (initializers may also be listed as inputs, with defaults)."""
    initialized = {t.name for t in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in initialized]


def _static_shapes(model: onnx.ModelProto) -> Shapes | None:
    """The inputs' (name, shape, dtype) when the model fixes them all, else None (known at run time).
    An input that is not a tensor counts as fixed: building at once lets the frontend refuse it."""
    out = []
    for vi in _runtime_inputs(model):
        if not vi.type.HasField("tensor_type"):
            out.append((vi.name, (), vi.type.WhichOneof("value") or "no type"))
            continue
        t = vi.type.tensor_type
        if not t.HasField("shape") or any(d.WhichOneof("value") != "dim_value" for d in t.shape.dim):
            return None
        try:
            dtype = str(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type))
        except (KeyError, ValueError):  # an element type numpy has no dtype for: the frontend names it
            dtype = f"onnx type {t.elem_type}"
        out.append((vi.name, tuple(int(d.dim_value) for d in t.shape.dim), dtype))
    return tuple(out)


class AotcBackendRep(BackendRep):
    """A prepared model: its package (built now when the model fixes every input shape, else on the
    first `run`, at the given arrays' shapes), run by aotc_runtime. Graph inputs whose values aotc needs
    at compile time (`fixed`) are built as constants with the values of each run."""

    def __init__(self, model: onnx.ModelProto, target: str, cache_dir: Path, num_threads: int | None):
        self.model_bytes = model.SerializeToString()
        self.name = model.graph.name or "model"
        self.input_names = [vi.name for vi in _runtime_inputs(model)]
        self.output_names = [o.name for o in model.graph.output]
        self.target = target
        self.cache_dir = cache_dir
        self.num_threads = num_threads
        self._loaded: dict[tuple[Shapes, Constants], Any] = {}
        self.fixed: tuple[str, ...] = ()
        self.static = _static_shapes(model)
        if self.static is not None:
            try:
                self.compiled(self.static)
            except RunTimeValueError as e:
                if not self._fixable(e):
                    raise
                self.fixed = e.inputs  # known at run time: built then, with their values

    def _fixable(self, e: RunTimeValueError) -> bool:
        """Whether the value a refusal needs derives from graph inputs only, none of them fixed already."""
        return bool(e.inputs) and all(n in self.input_names and n not in self.fixed for n in e.inputs)

    def compiled(self, shapes: Shapes, constants: Constants = ()) -> Any:
        """The package built for these input shapes (and constants), loaded by aotc_runtime (built unless
        cached)."""
        key = (shapes, constants)
        if key not in self._loaded:
            import aotc_runtime

            path = self._package(shapes, constants)
            self._loaded[key] = aotc_runtime.load(str(path), num_threads=self.num_threads)
        return self._loaded[key]

    def _package(self, shapes: Shapes, constants: Constants) -> Path:
        """`<cache>/<source>/<key>/<graph name>.aotc`, built unless there; the model file stays beside it,
        so a refusal's message names a file that exists."""
        from aotc.target import parse_target

        target = str(parse_target(self.target))  # `native` resolved: a cache may outlive a CPU swap
        key = hashlib.sha256()
        for part in (self.model_bytes, repr(shapes).encode(), target.encode()):
            key.update(hashlib.sha256(part).digest())
        if constants:
            key.update(hashlib.sha256(repr(constants).encode()).digest())
        entry = source_cache(self.cache_dir) / key.hexdigest()[:32]
        stem = _file_stem(self.name)
        path = entry / f"{stem}.aotc"
        if not path.is_file():
            model_path = entry / f"{stem}.onnx"
            if not model_path.is_file():
                write_atomic(model_path, self.model_bytes)
            self._build(model_path, shapes, constants, path)
        return path

    def _build(self, model_path: Path, shapes: Shapes, constants: Constants, path: Path) -> None:
        from aotc.api import compile as aotc_compile
        from aotc.search.model_tuning import TuningOptions

        # untuned (stored records still apply, no schedules of other CPUs measured) and not validated:
        # the caller compares the outputs with its own reference
        tuning = TuningOptions(trials=0, transfer=False)
        values = {
            name: np.frombuffer(data, dtype).reshape(shape).copy() for name, dtype, shape, data in constants
        }
        # a model that fixes its shapes is built as it is (its own checks speak); others at the run's shapes
        inputs = (
            None
            if shapes == self.static
            else {name: InputSpec(shape) for name, shape, _ in shapes if name not in values}
        )
        with tempfile.TemporaryDirectory(prefix="aotc-onnx-backend-") as tmp:
            package = aotc_compile(
                model_path,
                self.target,
                inputs=inputs,
                tuning=tuning,
                validate=False,
                output=Path(tmp) / path.name,
                constants=values,
            )
            package.save(path)  # whole or not at all: a concurrent run finds a complete package or none

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """The model's outputs, in graph order, for inputs given in graph-input order or by name."""
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        if isinstance(inputs, Mapping):
            missing = [name for name in self.input_names if name not in inputs]
            if missing:
                raise ValueError(
                    f"{self.name}: no value for input {missing[0]!r}; inputs: {', '.join(self.input_names)}"
                )
            by_name = {name: np.asarray(inputs[name]) for name in self.input_names}
        elif isinstance(inputs, Sequence):
            if len(inputs) != len(self.input_names):
                raise ValueError(
                    f"{self.name}: expected {len(self.input_names)} inputs ({', '.join(self.input_names)}), "
                    f"got {len(inputs)}"
                )
            by_name = {name: np.asarray(a) for name, a in zip(self.input_names, inputs)}
        else:
            raise TypeError(f"inputs must be a sequence or a mapping of arrays, got {type(inputs).__name__}")
        shapes = tuple((name, tuple(a.shape), str(a.dtype)) for name, a in by_name.items())
        model = self._compiled_for(shapes, by_name)
        outputs = model.run({t.name: by_name[t.name] for t in model.inputs})
        return tuple(outputs[name] for name in self.output_names)

    def _compiled_for(self, shapes: Shapes, by_name: dict[str, np.ndarray]) -> Any:
        """The package for a run: with the `fixed` inputs' values as constants, fixing more inputs while
        a build names further ones it needs at compile time (a value computed from a fixed one may be)."""
        while True:
            constants = tuple(
                (name, str(a.dtype), tuple(a.shape), np.ascontiguousarray(a).tobytes())
                for name, a in by_name.items()
                if name in self.fixed
            )
            try:
                return self.compiled(shapes, constants)
            except RunTimeValueError as e:
                if not self._fixable(e):
                    raise
                self.fixed += e.inputs


def _file_stem(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:100] or "model"


class AotcBackend(Backend):
    """The ONNX backend interface over aotc: CPU only, for the host (`llvm -mcpu=native`, aotc's
    default target) unless `prepare` is given `target=`. `cache_dir` (class attribute; None: `backend_cache_dir()`) holds the builds."""

    target: str = DEFAULT_TARGET
    cache_dir: Path | None = None

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper() == "CPU"

    @classmethod
    def prepare(cls, model: onnx.ModelProto | bytes, device: str = "CPU", **kwargs: Any) -> AotcBackendRep:
        """Build `model` (unless the cache holds it) and return it ready to run; refuses what aotc
        cannot compile with one of REFUSALS. kwargs: `target`, `num_threads`."""
        if not cls.supports_device(device):
            raise ValueError(f"aotc's ONNX backend runs on the CPU, not on {device!r}")
        if isinstance(model, bytes | bytearray):
            model = onnx.load_model_from_string(bytes(model))
        cache = cls.cache_dir if cls.cache_dir is not None else backend_cache_dir()
        target = kwargs.get("target", cls.target)
        return AotcBackendRep(model, target, Path(cache), kwargs.get("num_threads"))

    @classmethod
    def run_model(
        cls, model: onnx.ModelProto | bytes, inputs: Any, device: str = "CPU", **kwargs: Any
    ) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)


# module-level entry points, as onnx backends conventionally offer them
prepare = AotcBackend.prepare
run_model = AotcBackend.run_model
supports_device = AotcBackend.supports_device
