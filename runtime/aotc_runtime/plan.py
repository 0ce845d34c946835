"""The execution plan a kernel library carries in its `.aotc_plan` ELF section, and its checks.

aotc writes, at build, one canonical JSON document holding everything execution-critical: the entry
symbol, inputs and outputs, workspace and weights sizes, the CPU features the code needs, every kernel
with the byte size of each param it was compiled for, and every kernel call with its arguments. The
runtime believes that document only after checking it is self-consistent (every buffer inside what it
refers to), and believes the manifest only where it equals the document.

A package compiled for several input shapes (batch sizes) carries plan version 2: the shared fields
(target, triple, requires, weights size, kernels) and `variants`, each with its own entry symbol,
inputs, outputs, workspace size and calls, each checked as a version 1 plan is. A single shape keeps
version 1.

A GPU package (target `opencl` or `cuda -arch=sm_XX`) holds the same document as its member plan.json,
parsed with `gpu=True`: each kernel also has `gpu`, how its kernels are launched (`GPUKernelPlan`), every
launch is checked against the device's limits and every argument offset against its dtype's size.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

__all__ = [
    "BUFFER_KINDS",
    "DTYPES",
    "ELEMENTS",
    "MAX_LAUNCH_EXTENT",
    "MAX_THREADS_PER_BLOCK",
    "GPUKernelPlan",
    "GPULaunch",
    "PLAN_SECTION",
    "PLAN_VERSION",
    "VARIANTS_PLAN_VERSION",
    "ModelPlan",
    "PlanArg",
    "PlanCall",
    "PlanError",
    "PlanPrepare",
    "PlanTensor",
    "PlanVariant",
    "check_manifest_matches",
    "encode_plan",
    "parse_plan",
]

PLAN_SECTION = ".aotc_plan"
PLAN_VERSION = 1
VARIANTS_PLAN_VERSION = 2  # several input shapes, one variant each
BUFFER_KINDS = ("input", "output", "weight", "workspace")
# dtype -> itemsize: the element types a package may use (never object or structured dtypes)
DTYPES = {
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "float16": 2,
    "int32": 4,
    "uint32": 4,
    "float32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
}
# ml_dtypes types a package may take and return, each stored as the bits of a DTYPES type (one element per
# byte for the sub-byte ones, in its low bits, as ml_dtypes holds them)
ELEMENTS = {
    "bfloat16": "uint16",
    "float8_e4m3fn": "uint8",
    "float8_e4m3fnuz": "uint8",
    "float8_e5m2": "uint8",
    "float8_e5m2fnuz": "uint8",
    "float4_e2m1fn": "uint8",
    "float8_e8m0fnu": "uint8",
    "int4": "uint8",
    "uint4": "uint8",
    "int2": "uint8",
    "uint2": "uint8",
}
MAX_BYTES = 1 << 48  # no tensor, workspace or weights blob is larger: a larger number is damage
MAX_LAUNCH_EXTENT = (1 << 31) - 1  # a grid or block extent per axis (CUDA's grid.x limit, the largest)
MAX_THREADS_PER_BLOCK = 1024  # every CUDA GPU's limit; an OpenCL device's own may be lower
_SYMBOL_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_FIELDS = (
    "plan_version",
    "entry",
    "target",
    "triple",
    "requires",
    "inputs",
    "outputs",
    "workspace_bytes",
    "weights_nbytes",
    "kernels",
    "execution_plan",
)
_VARIANT_FIELDS = ("entry", "inputs", "outputs", "workspace_bytes", "execution_plan")
# Optional, all three or none: weights the package computes when it loads (docs/package.md#derived-weights)
_PREPARE_FIELDS = ("prepare", "prepare_plan", "weights_stored_nbytes")
_VARIANTS_FIELDS = (
    "plan_version",
    "target",
    "triple",
    "requires",
    "weights_nbytes",
    "kernels",
    "variants",
)


class PlanError(ValueError):
    """The plan is malformed or inconsistent, or the manifest differs from it; the message says where."""


@dataclass(frozen=True)
class PlanTensor:
    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    element: str | None = None
    """The ml_dtypes type (ELEMENTS) whose bits the tensor's `dtype` stores, if any."""


@dataclass(frozen=True)
class PlanArg:
    kind: str
    index: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class PlanCall:
    kernel: str
    args: tuple[PlanArg, ...]


@dataclass(frozen=True)
class GPULaunch:
    """One kernel launch of a GPU kernel function: `args` index its params, then its scratch buffers."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    args: tuple[int, ...]


@dataclass(frozen=True)
class GPUKernelPlan:
    """How a GPU kernel function runs: the device scratch buffers it needs, as (dtype, nbytes), and
    its launches in order."""

    scratch: tuple[tuple[str, int], ...]
    launches: tuple[GPULaunch, ...]


@dataclass(frozen=True)
class PlanVariant:
    """The model compiled for one set of input shapes: its entry function, I/O, workspace and calls."""

    entry: str
    inputs: tuple[PlanTensor, ...]
    outputs: tuple[PlanTensor, ...]
    workspace_bytes: int
    calls: tuple[PlanCall, ...]


@dataclass(frozen=True)
class PlanPrepare:
    """Weights computed when the package loads: weights.bin holds the first `stored_nbytes` bytes of the
    weights buffer, and `entry(weights)` computes the rest by `calls`, each reading and writing weights."""

    entry: str
    stored_nbytes: int
    calls: tuple[PlanCall, ...]


@dataclass(frozen=True)
class ModelPlan:
    """A checked plan: every argument of every variant lies inside the buffer it refers to. `entry`,
    `inputs`, `outputs`, `workspace_bytes` and `calls` are those of the first variant."""

    target: str
    triple: str
    requires: tuple[str, ...]
    weights_nbytes: int
    kernels: dict[str, tuple[tuple[str, int], ...]]  # symbol -> (dtype, nbytes) of each param
    variants: tuple[PlanVariant, ...]
    document: dict
    gpu: dict[str, GPUKernelPlan] = field(default_factory=dict)  # symbol -> launches (GPU plans only)
    prepare: PlanPrepare | None = None

    @property
    def weights_stored_nbytes(self) -> int:
        """The size of weights.bin: all the weights, or where some are computed at load, the rest."""
        return self.weights_nbytes if self.prepare is None else self.prepare.stored_nbytes

    @property
    def entry(self) -> str:
        return self.variants[0].entry

    @property
    def inputs(self) -> tuple[PlanTensor, ...]:
        return self.variants[0].inputs

    @property
    def outputs(self) -> tuple[PlanTensor, ...]:
        return self.variants[0].outputs

    @property
    def workspace_bytes(self) -> int:
        return self.variants[0].workspace_bytes

    @property
    def calls(self) -> tuple[PlanCall, ...]:
        return self.variants[0].calls

    @property
    def symbols(self) -> tuple[str, ...]:
        """Every entry and every kernel the plan calls: the library must define each one."""
        entries = [v.entry for v in self.variants]
        calls = [c for v in self.variants for c in v.calls]
        if self.prepare is not None:
            entries.append(self.prepare.entry)
            calls += self.prepare.calls
        return (*entries, *dict.fromkeys(c.kernel for c in calls))


def encode_plan(document: dict) -> bytes:
    """The canonical bytes of a plan document (sorted keys, no spaces, ASCII)."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


# ----------------------------------------------------------------------------- parsing


def parse_plan(raw: bytes, gpu: bool = False) -> ModelPlan:
    """Parse and check the bytes of a `.aotc_plan` section, or with `gpu` a GPU package's plan.json;
    raise PlanError when anything is off."""
    try:
        document = json.loads(raw.decode("ascii"), object_pairs_hook=_unique_keys)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise PlanError(f"the plan is not valid JSON ({err})") from None
    if not isinstance(document, dict):
        raise PlanError("the plan is not a JSON object")
    if encode_plan(document) != raw:
        raise PlanError("the plan is not in canonical form")
    version = document.get("plan_version")
    if type(version) is not int or version not in (PLAN_VERSION, VARIANTS_PLAN_VERSION):
        raise PlanError(
            f"the plan has version {version!r}, this runtime reads {PLAN_VERSION} and {VARIANTS_PLAN_VERSION}"
        )
    fields = _FIELDS if version == PLAN_VERSION else _VARIANTS_FIELDS
    if set(document) not in (set(fields), set(fields) | set(_PREPARE_FIELDS)) or (
        gpu and "prepare" in document
    ):
        raise PlanError(f"the plan has fields {sorted(document)}, expected {sorted(fields)}")
    target, triple = _string(document["target"], "target"), _string(document["triple"], "triple")
    requires = tuple(
        _string(f, f"requires[{i}]") for i, f in enumerate(_list(document["requires"], "requires"))
    )
    weights = _size(document["weights_nbytes"], "weights_nbytes")
    if version == PLAN_VERSION:
        described = [(document, "")]
    else:
        found = _list(document["variants"], "variants")
        if not found:
            raise PlanError("the plan's variants list is empty")
        described = [
            (_object(v, _VARIANT_FIELDS, f"variants[{i}]"), f"variants[{i}].") for i, v in enumerate(found)
        ]
    entries = [_symbol(d["entry"], f"{at}entry") for d, at in described]
    if "prepare" in document:
        entries.append(_symbol(document["prepare"], "prepare"))
    if len(set(entries)) != len(entries):
        raise PlanError("the plan names an entry symbol twice")
    kernels = _kernels(document["kernels"], set(entries), gpu)
    launches = _gpu_kernels(document["kernels"], kernels) if gpu else {}
    variants = tuple(_variant(d, at, kernels, weights, gpu) for d, at in described)
    _check_variants_agree(variants)
    prepare = _prepare(document, kernels, weights) if "prepare" in document else None
    return ModelPlan(target, triple, requires, weights, kernels, variants, document, launches, prepare)


def _prepare(document: dict, kernels: dict, weights: int) -> PlanPrepare:
    """The load-time calls: every argument inside the weights buffer (no input, output or workspace
    exists then), and weights.bin no larger than the weights buffer."""
    stored = _size(document["weights_stored_nbytes"], "weights_stored_nbytes")
    if stored > weights:
        raise PlanError(f"the plan's weights_stored_nbytes {stored} exceeds weights_nbytes {weights}")
    sizes: dict[str, list[int]] = {"input": [], "output": [], "weight": [weights], "workspace": []}
    calls = tuple(
        _call(c, f"prepare_plan[{i}]", kernels, sizes)
        for i, c in enumerate(_list(document["prepare_plan"], "prepare_plan"))
    )
    return PlanPrepare(document["prepare"], stored, calls)


def _variant(document: dict, at: str, kernels: dict, weights: int, gpu: bool = False) -> PlanVariant:
    """One variant's entry, I/O, workspace and calls, every argument checked against its buffer."""
    inputs = _tensors(document["inputs"], f"{at}inputs")
    outputs = _tensors(document["outputs"], f"{at}outputs")
    names = [t.name for t in inputs + outputs]
    if len(set(names)) != len(names):
        raise PlanError(f"the plan {at or ''}names an input or output twice")
    workspace = _size(document["workspace_bytes"], f"{at}workspace_bytes")
    sizes = {"input": [t.nbytes for t in inputs], "output": [t.nbytes for t in outputs]}
    sizes["weight"], sizes["workspace"] = [weights], [workspace]
    calls = tuple(
        _call(c, f"{at}execution_plan[{i}]", kernels, sizes, gpu)
        for i, c in enumerate(_list(document["execution_plan"], f"{at}execution_plan"))
    )
    return PlanVariant(document["entry"], inputs, outputs, workspace, calls)


def _check_variants_agree(variants: tuple[PlanVariant, ...]) -> None:
    """Variants are one model at several shapes: the same input and output names and dtypes, and input
    shapes that tell them apart (the runtime picks a variant by its inputs' shapes)."""
    first = variants[0]
    seen: dict[tuple, int] = {}
    for i, v in enumerate(variants):
        for role in ("inputs", "outputs"):
            mine = [(t.name, t.dtype) for t in getattr(v, role)]
            if mine != [(t.name, t.dtype) for t in getattr(first, role)]:
                raise PlanError(
                    f"the plan's variants[{i}].{role} differ from variants[0]'s in names or dtypes"
                )
        shapes = tuple(t.shape for t in v.inputs)
        if shapes in seen:
            raise PlanError(f"the plan's variants[{i}] has the input shapes of variants[{seen[shapes]}]")
        seen[shapes] = i


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"a key appears twice among {sorted(keys)}")
    return dict(pairs)


def _list(v: object, where: str) -> list:
    if not isinstance(v, list):
        raise PlanError(f"the plan's {where} is not a list")
    return v


def _string(v: object, where: str) -> str:
    if not isinstance(v, str):
        raise PlanError(f"the plan's {where} is not a string")
    return v


def _symbol(v: object, where: str) -> str:
    if not isinstance(v, str) or not _SYMBOL_RE.match(v):
        raise PlanError(f"the plan's {where} {v!r} is not a C identifier")
    return v


def _size(v: object, where: str) -> int:
    if type(v) is not int or not 0 <= v <= MAX_BYTES:
        raise PlanError(f"the plan's {where} {v!r} is not a byte count")
    return v


def _object(v: object, keys: tuple[str, ...], where: str) -> dict:
    if not isinstance(v, dict) or set(v) != set(keys):
        raise PlanError(f"the plan's {where} must have exactly the fields {', '.join(keys)}")
    return v


def _dtype(v: object, where: str) -> str:
    if not isinstance(v, str) or v not in DTYPES:
        raise PlanError(f"the plan's {where} has the unsupported dtype {v!r}")
    return v


def _tensors(v: object, where: str) -> tuple[PlanTensor, ...]:
    tensors = []
    for i, t in enumerate(_list(v, where)):
        at = f"{where}[{i}]"
        keys = ("name", "shape", "dtype") + (("element",) if isinstance(t, dict) and "element" in t else ())
        t = _object(t, keys, at)
        name, dtype = _string(t["name"], f"{at}.name"), _dtype(t["dtype"], at)
        element = t.get("element")
        if element is not None and ELEMENTS.get(element) != dtype:
            raise PlanError(f"the plan's {at} has the element type {element!r}, not one stored as {dtype}")
        shape = tuple(_size(d, f"{at}.shape") for d in _list(t["shape"], f"{at}.shape"))
        nbytes = DTYPES[dtype]
        for d in shape:
            nbytes = _size(nbytes * d, f"{at} size")
        tensors.append(PlanTensor(name, shape, dtype, nbytes, element))
    return tuple(tensors)


def _kernels(v: object, entries: set[str], gpu: bool = False) -> dict[str, tuple[tuple[str, int], ...]]:
    kernels: dict[str, tuple[tuple[str, int], ...]] = {}
    fields = ("symbol", "params", "gpu") if gpu else ("symbol", "params")
    for i, k in enumerate(_list(v, "kernels")):
        k = _object(k, fields, f"kernels[{i}]")
        symbol = _symbol(k["symbol"], f"kernels[{i}].symbol")
        if symbol in kernels or symbol in entries:
            raise PlanError(f"the plan names the kernel {symbol} twice")
        params = []
        for j, p in enumerate(_list(k["params"], f"kernels[{i}].params")):
            at = f"kernels[{i}].params[{j}]"
            p = _object(p, ("dtype", "nbytes"), at)
            params.append((_dtype(p["dtype"], at), _size(p["nbytes"], f"{at}.nbytes")))
        kernels[symbol] = tuple(params)
    return kernels


def _call(v: object, where: str, kernels: dict, sizes: dict[str, list[int]], gpu: bool = False) -> PlanCall:
    c = _object(v, ("kernel", "args"), where)
    kernel = _symbol(c["kernel"], f"{where}.kernel")
    params = kernels.get(kernel)
    if params is None:
        raise PlanError(f"the plan's {where} calls {kernel}, which is not one of its kernels")
    args = _list(c["args"], f"{where}.args")
    if len(args) != len(params):
        raise PlanError(
            f"the plan's {where} passes {len(args)} arguments to {kernel} of {len(params)} params"
        )
    checked = []
    for j, (a, (dtype, param_bytes)) in enumerate(zip(args, params)):
        at = f"{where}.args[{j}]"
        a = _object(a, ("kind", "index", "offset", "nbytes"), at)
        kind = a["kind"]
        if not isinstance(kind, str) or kind not in BUFFER_KINDS:
            raise PlanError(f"the plan's {at}.kind {kind!r} is not one of {', '.join(BUFFER_KINDS)}")
        index, offset = _size(a["index"], f"{at}.index"), _size(a["offset"], f"{at}.offset")
        nbytes = _size(a["nbytes"], f"{at}.nbytes")
        if nbytes != param_bytes:
            raise PlanError(f"the plan's {at} is {nbytes} bytes but {kernel} was compiled for {param_bytes}")
        if gpu and offset % DTYPES[dtype]:
            # a GPU kernel takes an element offset: a byte offset between elements has none
            raise PlanError(f"the plan's {at}.offset {offset} is not a multiple of {dtype}'s size")
        if index >= len(sizes[kind]):
            raise PlanError(f"the plan's {at} refers to {kind} {index} of {len(sizes[kind])}")
        bound = sizes[kind][index]
        if offset + nbytes > bound:
            raise PlanError(
                f"the plan's {at} covers bytes [{offset}, {offset + nbytes}) of a {bound}-byte {kind}"
            )
        checked.append(PlanArg(kind, index, offset, nbytes))
    return PlanCall(kernel, tuple(checked))


def _gpu_kernels(v: list, kernels: dict) -> dict[str, GPUKernelPlan]:
    """Each kernel function's launches, checked: params as the kernel's, scratch sizes, and per launch a
    kernel name unique in the package, a grid and block within the limits, and args in range."""
    out: dict[str, GPUKernelPlan] = {}
    names: set[str] = set()
    for i, k in enumerate(v):
        symbol, at = k["symbol"], f"kernels[{i}].gpu"
        g = _object(k["gpu"], ("params", "scratch", "launches"), at)
        params = _named_buffers(g["params"], f"{at}.params")
        if params != kernels[symbol]:
            raise PlanError(f"the plan's {at}.params differ from the params of {symbol}")
        scratch = _named_buffers(g["scratch"], f"{at}.scratch")
        found = _list(g["launches"], f"{at}.launches")
        if not found:
            raise PlanError(f"the plan's {at}.launches is empty")
        launches = []
        for j, launch in enumerate(found):
            where = f"{at}.launches[{j}]"
            launch = _object(launch, ("kernel", "grid", "block", "shared_bytes", "args"), where)
            name = _symbol(launch["kernel"], f"{where}.kernel")
            if name in names:
                raise PlanError(f"the plan names the GPU kernel {name} twice")
            names.add(name)
            grid, block = (
                _extents(launch["grid"], f"{where}.grid"),
                _extents(launch["block"], f"{where}.block"),
            )
            if math.prod(block) > MAX_THREADS_PER_BLOCK:
                raise PlanError(
                    f"the plan's {where}.block {list(block)} has {math.prod(block)} threads, more than "
                    f"{MAX_THREADS_PER_BLOCK}"
                )
            shared = _size(launch["shared_bytes"], f"{where}.shared_bytes")
            args = tuple(_size(a, f"{where}.args") for a in _list(launch["args"], f"{where}.args"))
            bound = len(params) + len(scratch)
            if any(a >= bound for a in args):
                raise PlanError(
                    f"the plan's {where}.args {list(args)} index past the {len(params)} params and "
                    f"{len(scratch)} scratch buffers of {symbol}"
                )
            launches.append(GPULaunch(name, grid, block, shared, args))  # type: ignore[arg-type]
        out[symbol] = GPUKernelPlan(scratch, tuple(launches))
    return out


def _named_buffers(v: object, where: str) -> tuple[tuple[str, int], ...]:
    buffers = []
    for i, b in enumerate(_list(v, where)):
        b = _object(b, ("name", "dtype", "nbytes"), f"{where}[{i}]")
        _string(b["name"], f"{where}[{i}].name")
        buffers.append((_dtype(b["dtype"], f"{where}[{i}]"), _size(b["nbytes"], f"{where}[{i}].nbytes")))
    return tuple(buffers)


def _extents(v: object, where: str) -> tuple[int, ...]:
    extents = _list(v, where)
    if len(extents) != 3 or not all(type(e) is int and 1 <= e <= MAX_LAUNCH_EXTENT for e in extents):
        raise PlanError(f"the plan's {where} {_show(extents)} must be 3 ints from 1 to {MAX_LAUNCH_EXTENT}")
    return tuple(extents)


# ----------------------------------------------------------------------------- manifest vs plan


def check_manifest_matches(manifest: dict, plan: ModelPlan) -> None:
    """Raise PlanError naming the first manifest field that differs from what the library was compiled for.
    With several variants, the manifest's top-level entry, inputs, outputs, workspace and calls are the
    first variant's and its `variants` must equal the plan's; with one, it has no `variants`."""
    doc = plan.document
    if "variants" in doc:
        first = doc["variants"][0]
        _same(manifest.get("variants"), doc["variants"], "variants")
    else:
        first = doc
        if "variants" in manifest:
            raise PlanError(
                "manifest.json has variants but the kernel library was compiled for one set of input shapes"
            )
    _same(manifest.get("entry"), first["entry"], "entry")
    _same(manifest.get("target"), doc["target"], "target")
    _same(manifest.get("triple"), doc["triple"], "triple")
    _same(manifest.get("requires"), doc["requires"], "requires")
    _same(manifest.get("inputs"), first["inputs"], "inputs")
    _same(manifest.get("outputs"), first["outputs"], "outputs")
    _same(
        _get(manifest, "memory_plan", "workspace_bytes"),
        first["workspace_bytes"],
        "memory_plan.workspace_bytes",
    )
    _same(_get(manifest, "weights", "nbytes"), doc["weights_nbytes"], "weights.nbytes")
    _same(manifest.get("execution_plan"), first["execution_plan"], "execution_plan")
    kernels = manifest.get("kernels")
    if not isinstance(kernels, list) or len(kernels) != len(doc["kernels"]):
        _same(kernels, doc["kernels"], "kernels")
    for i, (got, want) in enumerate(zip(kernels, doc["kernels"])):
        where = f"kernels[{i}]"
        if not isinstance(got, dict):
            _same(got, want, where)
        _same(got.get("symbol"), want["symbol"], f"{where}.symbol")
        if "gpu" in want:
            _same(got.get("gpu"), want["gpu"], f"{where}.gpu")
        params = got.get("params")
        if not isinstance(params, list) or len(params) != len(want["params"]):
            _same(params, want["params"], f"{where}.params")
        for j, (p, q) in enumerate(zip(params, want["params"])):
            at = f"{where}.params[{j}]"
            if not isinstance(p, dict):
                _same(p, q, at)
            _same(p.get("dtype"), q["dtype"], f"{at}.dtype")
            _same(_nbytes(p.get("shape"), q["dtype"]), q["nbytes"], f"{at}.shape", shown=p.get("shape"))


def _get(d: object, *keys: str) -> object:
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return d


def _nbytes(shape: object, dtype: str) -> int | None:
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        return None
    n = DTYPES[dtype]
    for d in shape:
        n *= d
    return n


def _same(got: object, want: object, where: str, shown: object = None) -> None:
    """Equal as JSON values, types included (1 is not 1.0 nor true); the message names the first difference."""
    if isinstance(want, dict):
        if not isinstance(got, dict):
            _differ(got, want, where)
        for key in want:
            if key not in got:
                raise PlanError(
                    f"manifest.json {where} lacks {key!r} (the kernel library has {_show(want[key])})"
                )
            _same(got[key], want[key], f"{where}.{key}")
        return
    if isinstance(want, list) and any(isinstance(w, (dict, list)) for w in want):
        if not isinstance(got, list):
            _differ(got, want, where)
        if len(got) != len(want):
            raise PlanError(
                f"manifest.json {where} has {len(got)} entries but the kernel library was compiled for {len(want)}"
            )
        for i, (g, w) in enumerate(zip(got, want)):
            _same(g, w, f"{where}[{i}]")
        return
    if not _equal(got, want):
        _differ(got if shown is None else shown, want, where, bytes_=shown is not None)


def _equal(a: object, b: object) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return a == b


def _differ(got: object, want: object, where: str, bytes_: bool = False) -> None:
    unit = " bytes" if bytes_ else ""
    raise PlanError(
        f"manifest.json {where} is {_show(got)} but the kernel library was compiled for {_show(want)}{unit}"
    )


def _show(v: object) -> str:
    text = json.dumps(v, sort_keys=True)
    return text if len(text) <= 200 else text[:200] + "..."
