"""Writing aotc packages: one zip holding manifest.json, lib/model.so and weights.bin.

For a GPU target (`opencl`, `cuda -arch=sm_XX`) the zip holds no library but plan.json (the execution
plan, each kernel with its launches) and the kernels: kernels.cl for OpenCL; kernels.cubin, kernels.ptx and
kernels.cu for CUDA (docs/package.md).

Weights are laid out in list order, each at a 64-byte aligned offset of weights.bin. Build the
execution plan with the offsets of `layout_weights(spec.weights)` (or the refs of `weight_refs`):
`write_package` lays the blob out the same way and checks every reference against it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import BinaryIO

import numpy as np
from aotc_runtime.package import (
    FORMAT,
    FORMAT_VERSION,
    GPU_PLAN,
    LIBRARY,
    MANIFEST,
    WEIGHTS,
    read_manifest,
    verify_package,
)
from aotc_runtime.plan import DTYPES, PLAN_VERSION, VARIANTS_PLAN_VERSION, encode_plan
from aotc_runtime.signing import SIGNATURE_MEMBER, TRUSTED_KEYS_ENV, load_trusted_keys, verify_signature

from aotc import __version__
from aotc.codegen.entry import ENTRY_SYMBOL, BufferRef, KernelCall, build_entry_ir
from aotc.codegen.gpu import GPUModule, compile_cuda, emit_gpu, gpu_source
from aotc.codegen.llvm import build_llvm_ir, compile_to_object, link_shared
from aotc.files import atomic_file
from aotc.ir.stmt import PrimFunc
from aotc.signing import sign_digest
from aotc.target import Target, cpu_features

__all__ = [
    "WEIGHT_ALIGNMENT",
    "BufferRef",
    "DerivedWeight",
    "IOSpec",
    "KernelCall",
    "PackageSpec",
    "VariantSpec",
    "describe_package",
    "entry_symbol",
    "layout_weights",
    "plan_document",
    "weight_refs",
    "write_package",
]

WEIGHT_ALIGNMENT = 64
_ZIP64_THRESHOLD = 1 << 31
PREPARE_SYMBOL = "aotc_prepare"  # computes the derived weights when the package loads


@dataclass(frozen=True)
class DerivedWeight:
    """A weight the package computes when it loads instead of storing it (docs/package.md#derived-weights):
    laid out after the stored weights; `derivation` says how, for the manifest."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    derivation: dict = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class IOSpec:
    """A model input or output. `element`: the ml_dtypes type (bfloat16, float8_e4m3fn, int4, ...) of a
    tensor stored as the bits of `dtype`, which the runtime takes and returns as an array of that type."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    element: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype).name)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def to_json(self) -> dict:
        out = {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}
        if self.element is not None:
            out["element"] = self.element
        return out


@dataclass
class VariantSpec:
    """The model at one more set of input shapes (batch sizes): its I/O, calls and workspace, as in
    PackageSpec; its calls use the package's kernels and weights."""

    inputs: list[IOSpec]
    outputs: list[IOSpec]
    calls: list[KernelCall]
    workspace_bytes: int = 0
    memory_plan: list[dict] = field(default_factory=list)


@dataclass
class PackageSpec:
    """Everything a package holds. `calls` refer to inputs/outputs by index, to weights by the offsets
    of `layout_weights(weights)`, and to workspace offsets below `workspace_bytes`. `other_variants`
    are the model at further input shapes (empty for one shape); the fields above are the first's."""

    name: str
    target: Target
    inputs: list[IOSpec]
    outputs: list[IOSpec]
    kernels: list[PrimFunc]
    calls: list[KernelCall]
    weights: list[tuple[str, np.ndarray]] = field(default_factory=list)
    workspace_bytes: int = 0
    memory_plan: list[dict] = field(default_factory=list)
    kernel_info: list[dict] = field(default_factory=list)
    provenance: dict = field(default_factory=dict)
    other_variants: list[VariantSpec] = field(default_factory=list)
    # weights computed at load, after the stored ones, by the calls of `prepare` (on weights alone)
    derived_weights: list[DerivedWeight] = field(default_factory=list)
    prepare: list[KernelCall] = field(default_factory=list)

    @property
    def variants(self) -> list[VariantSpec]:
        """Every variant, the first (this spec's own I/O and calls) first."""
        first = VariantSpec(self.inputs, self.outputs, self.calls, self.workspace_bytes, self.memory_plan)
        return [first, *self.other_variants]


def entry_symbol(variant: int) -> str:
    """The entry function of the variant at this position: `aotc_run`, then `aotc_run_1`, ..."""
    return ENTRY_SYMBOL if variant == 0 else f"{ENTRY_SYMBOL}_{variant}"


@dataclass(frozen=True)
class _WeightEntry:
    """A stored weight (`array`) or a derived one (`derived`), at its offset in the weights buffer."""

    name: str
    offset: int
    array: np.ndarray | None = None
    derived: DerivedWeight | None = None

    @property
    def dtype(self) -> str:
        return self.array.dtype.name if self.array is not None else np.dtype(self.derived.dtype).name

    @property
    def nbytes(self) -> int:
        return self.array.nbytes if self.array is not None else self.derived.nbytes

    def to_json(self) -> dict:
        shape = self.array.shape if self.array is not None else self.derived.shape
        out = {"name": self.name, "offset": self.offset, "shape": list(shape), "dtype": self.dtype}
        out["nbytes"] = self.nbytes
        if self.derived is not None:
            out["derived"] = self.derived.derivation
        return out


def _align(n: int) -> int:
    return -(-n // WEIGHT_ALIGNMENT) * WEIGHT_ALIGNMENT


def _weight_table(
    weights: list[tuple[str, np.ndarray]], derived: list[DerivedWeight] = ()
) -> tuple[list[_WeightEntry], int]:
    """The weights buffer: the stored weights (weights.bin), then the derived ones, each 64-byte aligned;
    and its size."""
    entries, pos = [], 0
    seen: set[str] = set()
    for name, array in weights:
        if not isinstance(array, np.ndarray):
            raise TypeError(f"weight {name!r} must be a numpy array, got {type(array).__name__}")
        if name in seen:
            raise ValueError(f"weight {name!r} appears twice")
        seen.add(name)
        offset = _align(pos)
        entries.append(_WeightEntry(name, offset, array))
        pos = offset + array.nbytes
    for d in derived:
        if d.name in seen:
            raise ValueError(f"weight {d.name!r} appears twice")
        seen.add(d.name)
        offset = _align(pos)
        entries.append(_WeightEntry(d.name, offset, derived=d))
        pos = offset + d.nbytes
    return entries, pos


def _stored_nbytes(table: list[_WeightEntry]) -> int:
    """The size of weights.bin: up to the end of the last stored weight."""
    return max((e.offset + e.nbytes for e in table if e.array is not None), default=0)


def layout_weights(
    weights: list[tuple[str, np.ndarray]], derived: list[DerivedWeight] = ()
) -> dict[str, int]:
    """Byte offset of each weight in the weights buffer: the stored in list order, then the derived,
    each 64-byte aligned."""
    return {e.name: e.offset for e in _weight_table(weights, derived)[0]}


def weight_refs(
    weights: list[tuple[str, np.ndarray]], derived: list[DerivedWeight] = ()
) -> dict[str, BufferRef]:
    """A `BufferRef("weight", offset=..., nbytes=...)` for each weight, as `write_package` lays them out."""
    return {
        e.name: BufferRef("weight", offset=e.offset, nbytes=e.nbytes)
        for e in _weight_table(weights, derived)[0]
    }


# ----------------------------------------------------------------------------- validation


def _validate(spec: PackageSpec) -> tuple[list[_WeightEntry], int]:
    if not spec.name or not isinstance(spec.name, str):
        raise ValueError("a package needs a non-empty name")
    if not (spec.target.is_cpu or spec.target.is_gpu):
        raise ValueError(f"package {spec.name}: target {spec.target} is not supported")
    variants = spec.variants
    for v in variants:
        _check_unique("input/output", [t.name for t in v.inputs + v.outputs])
    _check_variants_agree(variants)
    _check_unique("kernel", [f.name for f in spec.kernels])
    for f in spec.kernels:
        for b in f.params:
            if np.dtype(b.dtype).name not in DTYPES:
                raise ValueError(f"kernel {f.name} param {b.name}: dtype {b.dtype} cannot be in a package")
    entries = {entry_symbol(i) for i in range(len(variants))} | {PREPARE_SYMBOL}
    for f in spec.kernels:
        if f.name in entries:
            raise ValueError(f"kernel name {f.name!r} is reserved for an entry function")
    for v in variants:
        if not isinstance(v.workspace_bytes, int) or v.workspace_bytes < 0:
            raise ValueError(f"workspace_bytes must be a non-negative int, got {v.workspace_bytes!r}")
    if spec.kernel_info and len(spec.kernel_info) != len(spec.kernels):
        raise ValueError(f"kernel_info has {len(spec.kernel_info)} entries for {len(spec.kernels)} kernels")
    for i, info in enumerate(spec.kernel_info):
        clash = ({"symbol", "params", "gpu"} if spec.target.is_gpu else {"symbol", "params"}) & set(info)
        if clash:
            raise ValueError(
                f"kernel_info[{i}] must not set {', '.join(sorted(clash))} (the package writes them)"
            )
    for label in ("kernel_info", "memory_plan", "provenance"):
        try:
            json.dumps(getattr(spec, label))
        except (TypeError, ValueError) as err:
            raise ValueError(f"package {spec.name}: {label} is not JSON-serializable ({err})") from None
    table, total = _weight_table(spec.weights, spec.derived_weights)
    for i, v in enumerate(variants):
        _check_calls(spec.kernels, v, table, total, "" if i == 0 else f"variant {i} ")
    if spec.prepare or spec.derived_weights:
        if spec.target.is_gpu:
            raise ValueError(f"package {spec.name}: a GPU package cannot compute weights when it loads")
        if any(ref.kind != "weight" for c in spec.prepare for ref in c.args):
            raise ValueError(
                f"package {spec.name}: the calls that compute weights at load pass another buffer"
            )
        _check_calls(spec.kernels, VariantSpec([], [], spec.prepare), table, total, "prepare ")
    return table, total


def _check_variants_agree(variants: list[VariantSpec]) -> None:
    """One model at several shapes: the same I/O names and dtypes, and input shapes that differ."""
    seen: set[tuple] = set()
    for i, v in enumerate(variants):
        for role in ("inputs", "outputs"):
            mine = [(t.name, t.dtype) for t in getattr(v, role)]
            if mine != [(t.name, t.dtype) for t in getattr(variants[0], role)]:
                raise ValueError(
                    f"variant {i}: its {role} differ from the first variant's in names or dtypes"
                )
        shapes = tuple(t.shape for t in v.inputs)
        if shapes in seen:
            raise ValueError(f"variant {i}: input shapes {[list(s) for s in shapes]} appear twice")
        seen.add(shapes)


def _check_unique(what: str, names: list[str]) -> None:
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise ValueError(f"{what} name {n!r} appears twice")
        seen.add(n)


def _check_calls(
    funcs: list[PrimFunc], spec: VariantSpec, table: list[_WeightEntry], weights_bytes: int, label: str
) -> None:
    kernels = {f.name: f for f in funcs}
    weight_at = {e.offset: e for e in table}
    written: set[int] = set()
    for i, call in enumerate(spec.calls):
        func = kernels.get(call.symbol)
        if func is None:
            raise ValueError(f"{label}call {i}: no kernel named {call.symbol!r} among the package's kernels")
        if len(call.args) != len(func.params):
            raise ValueError(
                f"{label}call {i} ({call.symbol}): {len(call.args)} arguments for a kernel of "
                f"{len(func.params)} params"
            )
        for ref, param in zip(call.args, func.params):
            where = f"{label}call {i} ({call.symbol}) argument {param.name}"
            _check_ref(spec, ref, param, where, weights_bytes, weight_at)
            if ref.kind == "output":
                written.add(ref.index)
    for j, out in enumerate(spec.outputs):
        if j not in written and out.nbytes:  # an empty output has nothing to write
            raise ValueError(f"{label}output {out.name!r} is passed to no kernel of the execution plan")


def _check_ref(
    spec: VariantSpec, ref: BufferRef, param, where: str, weights_bytes: int, weight_at: dict
) -> None:
    itemsize = np.dtype(param.dtype).itemsize
    need = max(ref.nbytes, param.num_elements * itemsize)
    if ref.kind in ("input", "output"):
        ios = spec.inputs if ref.kind == "input" else spec.outputs
        if ref.index >= len(ios):
            raise ValueError(
                f"{where}: {ref.kind} index {ref.index} is out of range ({len(ios)} {ref.kind}s)"
            )
        io = ios[ref.index]
        if io.dtype != np.dtype(param.dtype).name:
            raise ValueError(f"{where}: kernel expects {param.dtype}, {ref.kind} {io.name!r} is {io.dtype}")
        bound, label = io.nbytes, f"{ref.kind} {io.name!r}"
    elif ref.kind == "weight":
        entry = weight_at.get(ref.offset)
        if entry is not None and entry.dtype != np.dtype(param.dtype).name:
            raise ValueError(f"{where}: kernel expects {param.dtype}, weight {entry.name!r} is {entry.dtype}")
        bound, label = weights_bytes, "the weights blob"
    else:
        bound, label = spec.workspace_bytes, "the workspace"
    if ref.offset % itemsize:
        raise ValueError(f"{where}: offset {ref.offset} is not a multiple of {param.dtype}'s size {itemsize}")
    if ref.offset + need > bound:
        raise ValueError(
            f"{where}: bytes [{ref.offset}, {ref.offset + need}) lie outside {label} ({bound} bytes)"
        )


# ----------------------------------------------------------------------------- writing


def write_package(spec: PackageSpec, path: str, sign_key: str | os.PathLike | None = None) -> dict:
    """Compile the kernels and entry function and write the package to `path` atomically; return its
    manifest. With `sign_key` (an Ed25519 private key PEM), the package also holds `signature.json`,
    a signature over its digest (the sha256 of manifest.json, which lists every other member's)."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot write {path}: directory {directory} does not exist")
    table, total = _validate(spec)
    if spec.target.is_gpu:
        modules = [emit_gpu(f, spec.target) for f in spec.kernels]
        plan = plan_document(spec, total, modules)
        members = [(GPU_PLAN, encode_plan(plan)), *_gpu_kernels(spec, modules)]
    else:
        plan = plan_document(spec, total, stored_nbytes=_stored_nbytes(table))
        members = [(LIBRARY, _build_library(spec, encode_plan(plan)))]
    with atomic_file(path) as f:
        return _write_zip(f, spec, table, plan, members, sign_key)


def _gpu_kernels(spec: PackageSpec, modules: list[GPUModule]) -> list[tuple[str, bytes]]:
    """The kernel members of a GPU package: OpenCL C source, or CUDA cubin + PTX + source."""
    if spec.target.kind == "opencl":
        return [("kernels.cl", gpu_source(modules, "opencl").encode())]
    source = gpu_source(modules, "cuda")
    arch = spec.target.arch
    return [
        ("kernels.cubin", compile_cuda(source, arch, output="cubin")),
        ("kernels.ptx", compile_cuda(source, arch, output="ptx")),
        ("kernels.cu", source.encode()),
    ]


def plan_document(
    spec: PackageSpec,
    weights_nbytes: int,
    gpu: list[GPUModule] | None = None,
    stored_nbytes: int | None = None,
) -> dict:
    """The execution-critical facts the kernel library carries (see `aotc_runtime.plan`). Each argument's
    nbytes is what its kernel param was compiled to access. One variant: plan version 1, its fields at
    the top; several: version 2 with `variants`. With `gpu` (each kernel's module), every kernel also
    has `gpu`: its launches (`GPUModule.launches()`), and the document is a GPU package's plan.json.
    Where weights are computed at load (`spec.prepare`), `stored_nbytes` is the size of weights.bin."""
    params = {f.name: [_param_bytes(b) for b in f.params] for f in spec.kernels}

    def calls_json(calls: list[KernelCall]) -> list[dict]:
        return [
            {
                "kernel": c.symbol,
                "args": [{**a.to_json(), "nbytes": n} for a, n in zip(c.args, params[c.symbol])],
            }
            for c in calls
        ]

    launches = [m.launches() for m in gpu] if gpu is not None else [None] * len(spec.kernels)
    variants = [
        {
            "entry": entry_symbol(i),
            "inputs": [t.to_json() for t in v.inputs],
            "outputs": [t.to_json() for t in v.outputs],
            "workspace_bytes": v.workspace_bytes,
            "execution_plan": calls_json(v.calls),
        }
        for i, v in enumerate(spec.variants)
    ]
    shared = {
        "target": str(spec.target),
        "triple": spec.target.triple,
        "requires": list(cpu_features(spec.target)),
        "weights_nbytes": weights_nbytes,
        "kernels": [
            {
                "symbol": f.name,
                "params": [{"dtype": np.dtype(b.dtype).name, "nbytes": _param_bytes(b)} for b in f.params],
                **({} if gpu_launches is None else {"gpu": gpu_launches}),
            }
            for f, gpu_launches in zip(spec.kernels, launches)
        ],
    }
    if spec.prepare:
        shared["prepare"] = PREPARE_SYMBOL
        shared["prepare_plan"] = calls_json(spec.prepare)
        shared["weights_stored_nbytes"] = weights_nbytes if stored_nbytes is None else stored_nbytes
    if len(variants) == 1:
        return {"plan_version": PLAN_VERSION, **variants[0], **shared}
    return {"plan_version": VARIANTS_PLAN_VERSION, **shared, "variants": variants}


def _param_bytes(buf) -> int:
    return int(buf.num_elements) * np.dtype(buf.dtype).itemsize


def _build_library(spec: PackageSpec, plan: bytes) -> bytes:
    kernels_ir = build_llvm_ir(list(spec.kernels), spec.target)
    objects = [compile_to_object(kernels_ir, spec.target)]
    for i, v in enumerate(spec.variants):
        # the first entry's module carries the plan section
        entry_ir = build_entry_ir(
            list(v.calls),
            spec.target,
            len(v.inputs),
            len(v.outputs),
            plan if i == 0 else b"",
            entry_symbol(i),
        )
        objects.append(compile_to_object(entry_ir, spec.target))
    if spec.prepare:
        prepare_ir = build_entry_ir(
            list(spec.prepare), spec.target, 0, 0, symbol=PREPARE_SYMBOL, weights_only=True
        )
        objects.append(compile_to_object(prepare_ir, spec.target))
    with tempfile.TemporaryDirectory(prefix="aotc-package-") as tmp:
        out = os.path.join(tmp, "model.so")
        link_shared(objects, out, spec.target.isa)
        with open(out, "rb") as f:
            return f.read()


def _write_zip(
    f: BinaryIO,
    spec: PackageSpec,
    table: list[_WeightEntry],
    plan: dict,
    code: list[tuple[str, bytes]],
    sign_key: str | os.PathLike | None = None,
) -> dict:
    """`code` are the members before the weights: the kernel library, or a GPU package's plan and kernels."""
    now = datetime.now(UTC)
    with zipfile.ZipFile(f, "w", allowZip64=True) as zf:
        members = {name: _write_member(zf, name, [data], len(data), now) for name, data in code}
        stored = plan.get("weights_stored_nbytes", plan["weights_nbytes"])
        members[WEIGHTS] = _write_member(zf, WEIGHTS, _weight_chunks(table), stored, now)
        manifest = _manifest(spec, table, plan, members, now)
        manifest_bytes = json.dumps(manifest, indent=2).encode() + b"\n"
        # Every member is stored, not deflated, so a reader needs no inflate (the C runtime).
        zf.writestr(_zip_info(MANIFEST, zipfile.ZIP_STORED, now), manifest_bytes)
        if sign_key is not None:
            block = sign_digest(sign_key, hashlib.sha256(manifest_bytes).hexdigest(), "package")
            zf.writestr(_zip_info(SIGNATURE_MEMBER, zipfile.ZIP_STORED, now), json.dumps(block, indent=2))
    return manifest


def _zip_info(name: str, compression: int, when: datetime) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=when.timetuple()[:6])
    info.compress_type = compression
    info.external_attr = 0o644 << 16
    return info


def _write_member(zf: zipfile.ZipFile, name: str, chunks, size: int, when: datetime) -> dict:
    digest, written = hashlib.sha256(), 0
    info = _zip_info(name, zipfile.ZIP_STORED, when)
    with zf.open(info, "w", force_zip64=size >= _ZIP64_THRESHOLD) as out:
        for chunk in chunks:
            view = memoryview(chunk).cast("B")
            out.write(view)
            digest.update(view)
            written += view.nbytes
    return {"sha256": digest.hexdigest(), "size": written}


def _weight_chunks(table: list[_WeightEntry]) -> Iterator[bytes | np.ndarray]:
    """weights.bin: the stored weights at their offsets (the derived ones are computed at load)."""
    pos = 0
    for e in table:
        if e.array is None:
            continue
        if e.offset > pos:
            yield bytes(e.offset - pos)
        a = np.ascontiguousarray(e.array)
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        yield a.reshape(-1).view(np.uint8)
        pos = e.offset + a.nbytes


def _manifest(spec: PackageSpec, table: list[_WeightEntry], plan: dict, members: dict, now: datetime) -> dict:
    """The manifest: the first variant's entry, I/O, calls and memory plan at the top, and with several
    variants, `variants` as the plan has them plus each one's memory plan."""
    info = spec.kernel_info or [{} for _ in spec.kernels]
    variants = plan.get("variants")
    first = plan if variants is None else variants[0]
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "name": spec.name,
        "target": plan["target"],
        "triple": plan["triple"],
        "requires": plan["requires"],
        "entry": first["entry"],
        "inputs": first["inputs"],
        "outputs": first["outputs"],
        "kernels": [
            {"symbol": f.name, "params": _params_json(f), **extra, **_gpu_json(k)}
            for f, extra, k in zip(spec.kernels, info, plan["kernels"])
        ],
        "execution_plan": first["execution_plan"],
        "memory_plan": {
            "alignment": WEIGHT_ALIGNMENT,
            "workspace_bytes": spec.workspace_bytes,
            "buffers": spec.memory_plan,
        },
        "weights": {
            "member": WEIGHTS,
            "alignment": WEIGHT_ALIGNMENT,
            "nbytes": plan["weights_nbytes"],
            **({"stored_nbytes": plan["weights_stored_nbytes"]} if "weights_stored_nbytes" in plan else {}),
            "tensors": [e.to_json() for e in table],
        },
        "members": members,
        "provenance": {
            **spec.provenance,
            "aotc_version": __version__,
            "created_utc": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
    }
    if variants is not None:
        manifest["variants"] = [
            {**v, "memory_plan": {"buffers": s.memory_plan}} for v, s in zip(variants, spec.variants)
        ]
    return manifest


def _gpu_json(plan_kernel: dict) -> dict:
    return {"gpu": plan_kernel["gpu"]} if "gpu" in plan_kernel else {}


def _describe_signature(block: bytes | None, digest: str, trusted_keys: list[str] | None) -> str:
    keys = load_trusted_keys(trusted_keys) if trusted_keys or os.environ.get(TRUSTED_KEYS_ENV) else {}
    if block is None:
        return "none (unsigned; loading with trusted keys refuses it)" if keys else "none (unsigned)"
    status = verify_signature(block, digest, "package", keys)
    if status.state == "verified":
        return f"verified, key {status.key_id} (trusted)"
    if status.state == "untrusted-key" and not keys:
        return f"valid, key {status.key_id} (no trusted keys given: integrity only, not authorship)"
    if status.state == "untrusted-key":
        return f"valid, key {status.key_id}, NOT among the trusted keys (loading with them is refused)"
    return f"INVALID ({status.message}); loading it is refused"


def _params_json(func: PrimFunc) -> list[dict]:
    return [{"name": b.name, "shape": list(b.shape), "dtype": b.dtype} for b in func.params]


# ----------------------------------------------------------------------------- inspection


def describe_package(path: str, verify: bool = True, trusted_keys: list[str] | None = None) -> str:
    """A human-readable summary of the package at `path` (for `aotc inspect`).

    Raises PackageError when the package is damaged or its manifest differs from its kernel library's
    plan; `verify=False` skips those checks and shows the manifest as it is. A signature is checked
    against `trusted_keys` (None: $AOTC_TRUSTED_KEYS) and described, not enforced."""
    path = os.fspath(path)
    if verify:
        checked = verify_package(path)
        manifest, digest = checked.manifest, f"sha256:{checked.digest}"
        against = GPU_PLAN if GPU_PLAN in manifest["members"] else "the kernel library's plan"
        integrity = f"ok (sha256 of {len(manifest['members'])} members, manifest matches {against})"
        signature = _describe_signature(checked.signature, checked.digest, trusted_keys)
    else:
        manifest = read_manifest(path)
        digest = integrity = signature = "not checked"
    requires = manifest.get("requires") or []
    lines = [
        f"package       {path} ({_size(os.path.getsize(path))}, format version {manifest['format_version']})",
        f"digest        {digest}",
        f"integrity     {integrity}",
        f"signature     {signature}",
        f"name          {manifest['name']}",
        f"target        {manifest['target']}",
        f"triple        {manifest['triple']}",
        f"requires      {', '.join(requires) if requires else _no_requirements(manifest)}",
    ]
    lines += _tensors("inputs", manifest["inputs"])
    lines += _tensors("outputs", manifest["outputs"])
    lines += _kernels(manifest["kernels"])
    lines.append(f"execution     {len(manifest['execution_plan'])} kernel calls via {manifest['entry']}")
    for v in manifest.get("variants", [])[1:]:
        shapes = ", ".join(f"{t['name']}{t['shape']}" for t in v["inputs"])
        lines.append(f"  variant     {shapes}: {len(v['execution_plan'])} kernel calls via {v['entry']}")
    lines.append(f"workspace     {_size(manifest['memory_plan']['workspace_bytes'])}")
    lines += _weights(manifest["weights"])
    lines.append("members")
    for name, entry in manifest["members"].items():
        lines.append(f"  {name:<14} {_size(entry.get('size', 0)):>10}  sha256 {entry['sha256'][:16]}")
    lines.append("provenance")
    lines += [f"  {k}: {_value(v)}" for k, v in manifest["provenance"].items()]
    return "\n".join(lines)


def _no_requirements(manifest: dict) -> str:
    return "a GPU (its kernels run there)" if GPU_PLAN in manifest["members"] else "no CPU extensions"


def _tensors(title: str, tensors: list[dict]) -> list[str]:
    width = max((len(t["name"]) for t in tensors), default=0)
    return [title] + [f"  {t['name']:<{width}}  {t['dtype']:<8} {t['shape']}" for t in tensors]


def _kernels(kernels: list[dict]) -> list[str]:
    lines = [f"kernels ({len(kernels)})"]
    for k in kernels:
        lines.append(f"  {k['symbol']}")
        lines += _launches(k.get("gpu"))
        for key, value in k.items():
            if key in ("symbol", "params", "gpu"):
                continue
            if isinstance(value, str) and "\n" in value:
                lines.append(f"    {key}:")
                lines += [f"      {line}" for line in value.rstrip("\n").splitlines()]
            else:
                lines.append(f"    {key}: {_value(value)}")
    return lines


def _launches(gpu: object) -> list[str]:
    """A GPU kernel function's launches: grid x block, static shared memory, scratch (manifest data:
    anything odd is shown as it is)."""
    if not isinstance(gpu, dict):
        return [] if gpu is None else [f"    gpu: {_value(gpu)}"]
    lines = []
    for launch in gpu.get("launches") or []:
        if not isinstance(launch, dict):
            lines.append(f"    launch {_value(launch)}")
            continue
        shape = f"grid {_value(launch.get('grid'))} x block {_value(launch.get('block'))}"
        shared = launch.get("shared_bytes")
        extra = f", {_size(shared)} shared" if isinstance(shared, int) and shared > 0 else ""
        lines.append(f"    launch {_value(launch.get('kernel'))}: {shape}{extra}")
    scratch = gpu.get("scratch") or []
    sizes = [b.get("nbytes") for b in scratch if isinstance(b, dict)] if isinstance(scratch, list) else []
    if sizes:
        total = sum(n for n in sizes if isinstance(n, int))
        lines.append(f"    scratch: {len(sizes)} device buffers, {_size(total)}")
    return lines


def _weights(weights: dict, limit: int = 20) -> list[str]:
    tensors = weights.get("tensors", [])
    total = weights.get("nbytes", 0)
    stored = weights.get("stored_nbytes")
    split = "" if stored is None else f" ({_size(stored)} stored, {_size(total - stored)} computed at load)"
    lines = [f"weights       {len(tensors)} tensors, {_size(total)}{split}"]
    for t in tensors[:limit]:
        lines.append(f"  {t['name']}  {t['dtype']} {t['shape']}  at {t['offset']}  {_size(t['nbytes'])}")
    if len(tensors) > limit:
        lines.append(f"  ... and {len(tensors) - limit} more")
    return lines


def _value(v: object) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def _size(n: float) -> str:
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            break
    return f"{n:.1f} {unit}"
