"""GPU codegen: a PrimFunc with thread-binding loops -> kernel source in CUDA spelling, valid OpenCL C too.

The body is written once, in CUDA's spelling; a prelude per language maps it (thread and block indices,
`__shared__`, `__syncthreads()`, the `GPTR` qualifier of global pointers, 64-bit integer types, the float
math functions). Each root statement of the function becomes one kernel, launched in order; buffers
the function allocates in "global" scope become a workspace in device memory passed to the kernels.
A reduction across a block's threads arrives lowered to plain statements (registers, a shared-memory
tree, barriers; see aotc/schedule/lower.py), so both languages get it from the same body.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from aotc.codegen.cuda_compiler import GPUCompileError, compile_cuda, cuda_compiler_name, nvcc_path
from aotc.codegen.vecmath import LIBM_ONLY
from aotc.ir.expr import (
    Binary,
    Buffer,
    Call,
    Cast,
    Compare,
    Const,
    Expr,
    Load,
    Logical,
    Reinterpret,
    Select,
    Var,
    dtype_bits,
    free_vars,
    is_float,
    walk,
)
from aotc.ir.stmt import (
    Allocate,
    Barrier,
    BufferStore,
    For,
    ForKind,
    IfThenElse,
    LetStmt,
    PrimFunc,
    Seq,
    Stmt,
    stmt_children,
    walk_stmts,
)


class GPUCodegenError(ValueError):
    """A loop program that no correct GPU kernel implements (or that breaks the target's limits)."""


CUDA_PRELUDE = """\
#define GPTR
#define RESTRICT __restrict__
#define AOTC_INLINE static __device__ __forceinline__
#define AOTC_BLOCK(x, y, z) __launch_bounds__((x) * (y) * (z))
#define AOTC_INF_F32 __int_as_float(0x7f800000)
#define AOTC_NAN_F32 __int_as_float(0x7fc00000)
#define AOTC_INF_F64 __longlong_as_double(0x7ff0000000000000LL)
#define AOTC_NAN_F64 __longlong_as_double(0x7ff8000000000000LL)
#define AOTC_AS_int(x) __float_as_int(x)
#define AOTC_AS_uint(x) __float_as_uint(x)
#define AOTC_AS_float(x) __int_as_float((int)(x))
#define AOTC_AS_long(x) __double_as_longlong(x)
#define AOTC_AS_ulong(x) ((u64)__double_as_longlong(x))
#define AOTC_AS_double(x) __longlong_as_double((i64)(x))
typedef long long i64;
typedef unsigned long long u64;
"""

OPENCL_PRELUDE = """\
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#define GPTR __global
#define RESTRICT restrict
#define AOTC_INLINE static inline
#define AOTC_BLOCK(x, y, z) __attribute__((reqd_work_group_size(x, y, z)))
#define __global__ __kernel
#define __shared__ __local
#define __syncthreads() barrier(CLK_LOCAL_MEM_FENCE)
#define threadIdx ((uint3)(get_local_id(0), get_local_id(1), get_local_id(2)))
#define blockIdx ((uint3)(get_group_id(0), get_group_id(1), get_group_id(2)))
#define AOTC_INF_F32 INFINITY
#define AOTC_NAN_F32 NAN
#define AOTC_INF_F64 ((double)INFINITY)
#define AOTC_NAN_F64 ((double)NAN)
#define expf exp
#define logf log
#define sqrtf sqrt
#define tanhf tanh
#define erff erf
#define fabsf fabs
#define floorf floor
#define ceilf ceil
#define rintf rint
#define fminf fmin
#define fmaxf fmax
#define powf pow
#define fmodf fmod
#define copysignf copysign
#define sinf sin
#define cosf cos
#define tanf tan
#define asinf asin
#define acosf acos
#define atanf atan
#define sinhf sinh
#define coshf cosh
#define asinhf asinh
#define acoshf acosh
#define atanhf atanh
#define AOTC_AS_int(x) as_int(x)
#define AOTC_AS_uint(x) as_uint(x)
#define AOTC_AS_float(x) as_float((int)(x))
#define AOTC_AS_long(x) as_long(x)
#define AOTC_AS_ulong(x) as_ulong(x)
#define AOTC_AS_double(x) as_double((i64)(x))
typedef long i64;
typedef ulong u64;
"""

# Python's floor division and modulo (numpy's, too); a zero divisor gives 0 as on the CPU.
_HELPERS = """\
AOTC_INLINE i64 aotc_floordiv(i64 a, i64 b) {
  if (b == 0) return 0;
  i64 q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
AOTC_INLINE i64 aotc_floormod(i64 a, i64 b) {
  if (b == 0) return 0;
  i64 r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
"""
# numpy's npy_divmod for floats (np.remainder, np.floor_divide), as the CPU code computes them: exact,
# signed zeros and a zero divisor included
_FLOAT_HELPERS = """\
AOTC_INLINE <T> aotc_floormod_<S>(<T> a, <T> b) {
  <T> m = fmod<F>(a, b);
  if (b == (<T>)0) return m;
  if (m != (<T>)0) return ((b < (<T>)0) != (m < (<T>)0)) ? m + b : m;
  return copysign<F>((<T>)0, b);
}
AOTC_INLINE <T> aotc_floordiv_<S>(<T> a, <T> b) {
  <T> m = fmod<F>(a, b);
  <T> q = a / b;
  if (b == (<T>)0) return q;
  <T> d = (a - m) / b;
  if (m != (<T>)0 && ((b < (<T>)0) != (m < (<T>)0))) d -= (<T>)1;
  if (d == (<T>)0) return copysign<F>((<T>)0, q);
  <T> f = floor<F>(d);
  return (d - f > (<T>)0.5) ? f + (<T>)1 : f;
}
"""
_FLOAT_HELPER_TYPES = {"f32": ("float", "f"), "f64": ("double", "")}


def _helpers(body: str) -> str:
    """The helper functions a source needs: the integer ones always, a float type's where the kernels
    call them (a double one would not build on an OpenCL device without fp64)."""
    return _HELPERS + "".join(
        _FLOAT_HELPERS.replace("<T>", t).replace("<S>", suffix).replace("<F>", f)
        for suffix, (t, f) in _FLOAT_HELPER_TYPES.items()
        if f"_{suffix}(" in body
    )


_C_TYPES = {
    "float32": "float",
    "float64": "double",
    "int8": "signed char",
    "int16": "short",
    "int32": "int",
    "int64": "i64",
    "uint8": "unsigned char",
    "uint16": "unsigned short",
    "uint32": "unsigned int",
    "uint64": "u64",
    "bool": "unsigned char",
}
_ITEM_BYTES = {"float32": 4, "float64": 8, "int8": 1, "int16": 2, "int32": 4, "int64": 8, "bool": 1}
_ITEM_BYTES |= {"uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8}
_INFIX = {"add": "+", "sub": "-", "mul": "*"}
_BITWISE = {"bitand": "&", "bitor": "|", "bitxor": "^"}
_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_AXES = ("x", "y", "z")
# C, CUDA and OpenCL C keywords and the names the preludes define: an IR name (an ONNX node's, say) may
# be any of them
_RESERVED_WORDS = """auto break case char const constant continue default do double else enum extern float for goto
    if inline int long register restrict return short signed sizeof static struct switch typedef union
    unsigned void volatile while bool half kernel global local private read_only write_only read_write
    uchar ushort uint ulong char2 char4 float2 float3 float4 float8 float16 int2 int4 uint3 image2d_t
    image3d_t sampler_t event_t size_t ptrdiff_t intptr_t uintptr_t complex imaginary true false
    __global__ __shared__ __device__ __constant__ __kernel __global __local threadIdx blockIdx blockDim
    gridDim warpSize barrier GPTR RESTRICT AOTC_INLINE AOTC_BLOCK i64 u64 aotc_floordiv aotc_floormod
    aotc_floordiv_f32 aotc_floormod_f32 aotc_floordiv_f64 aotc_floormod_f64 fmod fmodf copysign copysignf exp log sqrt
    tanh erf fabs floor ceil rint fmin fmax pow expf logf sqrtf tanhf erff fabsf floorf ceilf rintf fminf
    fmaxf powf min max abs select asm template class new delete this operator namespace using"""
_RESERVED_WORDS += " sin cos tan asin acos atan sinh cosh asinh acosh atanh sinf cosf tanf asinf acosf atanf"
_RESERVED_WORDS += " sinhf coshf asinhf acoshf atanhf"
_RESERVED = frozenset(_RESERVED_WORDS.split())


@dataclass(frozen=True)
class LaunchConfig:
    """CUDA's grid (blocks) and block (threads) sizes; OpenCL's global size is their product per axis."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int

    @property
    def threads_per_block(self) -> int:
        return math.prod(self.block)


@dataclass(frozen=True)
class GPUKernel:
    name: str
    params: tuple[Buffer, ...]  # the function's params and workspace buffers it uses, in that order
    launch: LaunchConfig
    local_words: int = 0  # 32-bit words of the arrays each thread declares (its register tiles)


@dataclass(frozen=True)
class GPUModule:
    """The kernels of one PrimFunc, in launch order, and the one source (without prelude) holding them."""

    body: str
    kernels: tuple[GPUKernel, ...]
    params: tuple[Buffer, ...]
    workspace: tuple[Buffer, ...] = field(default=())

    @property
    def cuda_source(self) -> str:
        return gpu_source([self], "cuda")

    @property
    def opencl_source(self) -> str:
        return gpu_source([self], "opencl")

    def launches(self) -> dict:
        """How a runtime runs this function (JSON): per kernel in launch order its name, grid, block,
        static shared bytes, and its buffer arguments as indices into `params` + `scratch` (the
        function's parameters, then the device memory it needs for itself)."""
        index = {id(b): i for i, b in enumerate((*self.params, *self.workspace))}
        return {
            "params": [_buffer_json(b) for b in self.params],
            "scratch": [_buffer_json(b) for b in self.workspace],
            "launches": [
                {
                    "kernel": k.name,
                    "grid": list(k.launch.grid),
                    "block": list(k.launch.block),
                    "shared_bytes": k.launch.shared_bytes,
                    "args": [index[id(b)] for b in k.params],
                }
                for k in self.kernels
            ],
        }


def gpu_source(modules: list[GPUModule], language: str) -> str:
    """One source holding the kernels of `modules` ("cuda" or "opencl"); kernel names must be unique."""
    body = "\n".join(m.body for m in modules)
    if language == "cuda":
        return f'{CUDA_PRELUDE}extern "C" {{\n{_helpers(body)}\n{body}}}\n'
    if language == "opencl":
        return f"{OPENCL_PRELUDE}{_helpers(body)}\n{body}"
    raise ValueError(f"language must be 'cuda' or 'opencl', got {language!r}")


def _buffer_json(b: Buffer) -> dict:
    return {"name": b.name, "dtype": b.dtype, "nbytes": b.num_elements * _ITEM_BYTES[b.dtype]}


def c_type(dtype: str) -> str:
    if dtype not in _C_TYPES:
        raise GPUCodegenError(f"dtype {dtype} is not supported in GPU kernels yet")
    return _C_TYPES[dtype]


def emit_gpu(func: PrimFunc, target=None) -> GPUModule:
    """The kernels of `func`; with a GPU `target`, launches past its limits are refused."""
    body = func.body
    workspace: list[Buffer] = []
    while isinstance(body, Allocate) and body.buffer.scope == "global":
        workspace.append(body.buffer)
        body = body.body
    roots = body.stmts if isinstance(body, Seq) else (body,)
    names = _Names()
    for b in (*func.params, *workspace):
        names.buffer(b)
    kernels, texts = [], []
    for n, root in enumerate(roots):
        name = func.name if len(roots) == 1 else f"{func.name}_k{n}"
        kernel, text = _KernelWriter(names, name, (*func.params, *workspace)).write(root)
        if target is not None:
            _check_limits(kernel, target)
        kernels.append(kernel)
        texts.append(text)
    return GPUModule("\n".join(texts), tuple(kernels), tuple(func.params), tuple(workspace))


# A thread's arrays live in registers only when they fit: 255 32-bit registers per thread on NVIDIA GPUs,
# which also hold the operands and addresses. Larger ones (sampled tiles reached 4096 outputs per thread)
# sit in local memory and cannot be fast, so a program with them is refused rather than measured; in
# sampled sm_90 GEMM kernels every 256-word tile spilled to the stack (ptxas -v) and no 128-word one did.
MAX_LOCAL_WORDS_PER_THREAD = 128


def _check_limits(kernel: GPUKernel, target) -> None:
    hw = target.hw
    launch = kernel.launch
    words = kernel.local_words
    if words > MAX_LOCAL_WORDS_PER_THREAD:
        raise GPUCodegenError(
            f"kernel {kernel.name}: {words} 32-bit words of per-thread arrays, more than the "
            f"{MAX_LOCAL_WORDS_PER_THREAD} registers can hold"
        )
    if hw.registers_per_block and words * launch.threads_per_block > hw.registers_per_block:
        raise GPUCodegenError(
            f"kernel {kernel.name}: {launch.threads_per_block} threads with {words} words of arrays each, "
            f"more than {target}'s {hw.registers_per_block} registers per block"
        )
    if launch.threads_per_block > hw.max_threads_per_block:
        raise GPUCodegenError(
            f"kernel {kernel.name}: {launch.threads_per_block} threads per block, more than {target}'s "
            f"{hw.max_threads_per_block}"
        )
    if launch.shared_bytes > hw.max_shared_memory_per_block:
        raise GPUCodegenError(
            f"kernel {kernel.name}: {launch.shared_bytes} bytes of shared memory per block, more than "
            f"{target}'s {hw.max_shared_memory_per_block}"
        )


class _Names:
    """C identifiers for variables and buffers, unique within the module (IR names may hold dots)."""

    def __init__(self) -> None:
        self.taken: set[str] = set()
        self.by_id: dict[int, str] = {}
        self.keep: list[object] = []  # ids stay valid while their objects live

    def _fresh(self, base: str) -> str:
        clean = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in base) or "v"
        if clean[0].isdigit() or clean in _RESERVED:
            clean = "v" + clean
        name, n = clean, 1
        while name in self.taken:
            name, n = f"{clean}_{n}", n + 1
        self.taken.add(name)
        return name

    def var(self, v: Var) -> str:
        if id(v) not in self.by_id:
            self.by_id[id(v)] = self._fresh(v.name)
            self.keep.append(v)
        return self.by_id[id(v)]

    def buffer(self, b: Buffer) -> str:
        if id(b) not in self.by_id:
            name = self.var(b)  # type: ignore[arg-type]
            self.taken |= {f"{name}_base", f"{name}_off"}  # a global buffer's kernel arguments
        return self.by_id[id(b)]


class _KernelWriter:
    def __init__(self, names: _Names, name: str, globals_: tuple[Buffer, ...]) -> None:
        self.names = names
        self.name = name
        self.globals = globals_
        self.extent: dict[str, int] = {}  # launch extent per thread tag
        self.thread_vars: set[Var] = set()  # loop variables bound to threadIdx
        self.nonneg_vars: set[Var] = set()  # variables known >= 0: loop and thread indices
        self.shared: list[Buffer] = []
        self.index_type = "i64"

    def write(self, root: Stmt) -> tuple[GPUKernel, str]:
        for s in walk_stmts(root):
            if isinstance(s, For) and s.kind == ForKind.THREAD_BINDING and s.thread_tag != "vthread":
                self.extent[s.thread_tag] = max(self.extent.get(s.thread_tag, 1), s.max_extent)
                if s.thread_tag.startswith("threadIdx"):
                    self.thread_vars.add(s.var)
            if isinstance(s, Allocate):
                if s.buffer.scope == "global":
                    raise GPUCodegenError(f"buffer {s.buffer.name}: device memory allocated inside a kernel")
                if s.buffer.scope == "shared":
                    self.shared.append(s.buffer)
        self._check_races(root)
        self.index_type = "int" if _fits_int32_indices(root, self.globals, self.extent) else "i64"
        used = {id(b) for s in walk_stmts(root) for b in _buffers_of(s)}
        params = tuple(b for b in self.globals if id(b) in used)
        lines: list[str] = []
        self._stmt(root, 1, lines, divergent="")
        # every buffer is a (base pointer, element offset) pair: OpenCL cannot offset a cl_mem on the host,
        # and one argument convention serves both languages and every buffer of a package's memory plan
        args = ", ".join(
            f"GPTR {c_type(b.dtype)}* {self.names.buffer(b)}_base, i64 {self.names.buffer(b)}_off"
            for b in params
        )
        offsets = [
            f"  GPTR {c_type(b.dtype)}* RESTRICT {self.names.buffer(b)} = {self.names.buffer(b)}_base + "
            f"{self.names.buffer(b)}_off;"
            for b in params
        ]
        shared_decls = [
            f"  __shared__ {c_type(b.dtype)} {self.names.buffer(b)}[{b.num_elements}];" for b in self.shared
        ]
        grid = tuple(self.extent.get(f"blockIdx.{a}", 1) for a in _AXES)
        block = tuple(self.extent.get(f"threadIdx.{a}", 1) for a in _AXES)
        # the block size, known to the compiler: ptxas then keeps registers within what a block of that
        # size may use (without it, large blocks failed to launch: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)
        bounds = "AOTC_BLOCK({}, {}, {})".format(*block)
        text = "\n".join(
            [f"__global__ void {bounds} {self.name}({args}) {{", *offsets, *shared_decls, *lines, "}", ""]
        )
        shared_bytes = sum(b.num_elements * _ITEM_BYTES[b.dtype] for b in self.shared)
        local_words = sum(
            b.num_elements * -(-_ITEM_BYTES[b.dtype] // 4)
            for s in walk_stmts(root)
            if isinstance(s, Allocate) and (b := s.buffer).scope == "local"
        )
        launch = LaunchConfig(grid, block, shared_bytes)  # type: ignore[arg-type]
        return GPUKernel(self.name, params, launch, local_words), text

    def _check_races(self, root: Stmt) -> None:
        """Refuse an update (a store reading its own buffer) that threads could run on one element at once."""
        launched = {t for t, e in self.extent.items() if e > 1}

        def visit(s: Stmt, bound: dict[str, Var]) -> None:
            if isinstance(s, For) and s.kind == ForKind.THREAD_BINDING and s.thread_tag != "vthread":
                # the same index bound again inside is the loop of threads filling a shared buffer together
                if s.thread_tag in bound and any(
                    isinstance(c, BufferStore) and c.buffer.scope != "shared" for c in walk_stmts(s.body)
                ):
                    raise GPUCodegenError(
                        f"kernel {self.name}: {s.thread_tag} is bound inside a loop bound to it, around "
                        "stores to memory other than shared"
                    )
                bound = {**bound, s.thread_tag: s.var}
            if isinstance(s, BufferStore) and s.buffer.scope != "local":
                reads_self = any(isinstance(n, Load) and n.buffer is s.buffer for n in walk(s.value))
                index_vars = set().union(*(free_vars(i) for i in s.indices))
                # a shared buffer has one copy per block: only threads of one block can collide on it
                tags = [t for t in launched if s.buffer.scope != "shared" or t.startswith("threadIdx")]
                for tag in tags if reads_self else ():
                    if tag not in bound or bound[tag] not in index_vars:
                        how = (
                            "a reduction across blocks is not supported"
                            if tag.startswith("blockIdx")
                            else "threads reduce together when a reduce iterator, not fused with spatial "
                            "ones, is bound to threadIdx: a cross-thread reduction"
                        )
                        raise GPUCodegenError(
                            f"buffer {s.buffer.name}: the threads along {tag} update the same elements ({how})"
                        )
            for c in stmt_children(s):
                visit(c, bound)

        visit(root, {})

    # ---- statements ---------------------------------------------------------------------------

    def _stmt(self, s: Stmt, depth: int, out: list[str], divergent: str) -> None:
        pad = "  " * depth
        if isinstance(s, Seq):
            for c in s.stmts:
                self._stmt(c, depth, out, divergent)
        elif isinstance(s, For):
            self._for(s, depth, out, divergent)
        elif isinstance(s, IfThenElse):
            cond = self._expr(s.cond)
            why = divergent or (f"if ({cond})" if free_vars(s.cond) & self.thread_vars else "")
            out.append(f"{pad}if ({cond}) {{")
            self._stmt(s.then_case, depth + 1, out, why)
            if s.else_case is not None:
                out.append(f"{pad}}} else {{")
                self._stmt(s.else_case, depth + 1, out, why)
            out.append(f"{pad}}}")
        elif isinstance(s, BufferStore):
            target = f"{self.names.buffer(s.buffer)}[{self._expr(s.buffer.flat_index(s.indices))}]"
            out.append(f"{pad}{target} = {self._value_as(s.value, s.buffer.dtype)};")
        elif isinstance(s, Allocate):
            b = s.buffer
            if b.scope == "local":
                out.append(f"{pad}{c_type(b.dtype)} {self.names.buffer(b)}[{b.num_elements}];")
            self._stmt(s.body, depth, out, divergent)
        elif isinstance(s, LetStmt):
            out.append(f"{pad}const {c_type(s.var.dtype)} {self.names.var(s.var)} = {self._expr(s.value)};")
            if free_vars(s.value) & self.thread_vars:
                self.thread_vars.add(s.var)
            if self._nonneg(s.value):
                self.nonneg_vars.add(s.var)
            self._stmt(s.body, depth, out, divergent)
        elif isinstance(s, Barrier):
            if divergent:
                raise GPUCodegenError(
                    f"kernel {self.name}: a barrier under `{divergent}`, which not all threads of a block "
                    "reach (the schedule's splits must divide the thread-bound extents)"
                )
            out.append(f"{pad}__syncthreads();")
        else:
            raise GPUCodegenError(f"statement {type(s).__name__} has no GPU form")

    def _for(self, s: For, depth: int, out: list[str], divergent: str) -> None:
        pad = "  " * depth
        var = self.names.var(s.var)
        extent = self._expr(s.extent)
        if s.kind == ForKind.THREAD_BINDING and s.thread_tag != "vthread":
            tag = s.thread_tag
            self.nonneg_vars.add(s.var)
            out.append(f"{pad}{{")
            out.append(f"{pad}  const {self.index_type} {var} = ({self.index_type}){tag};")
            full = isinstance(s.extent, Const) and s.extent.value == self.extent[tag]
            if full:
                self._stmt(s.body, depth + 1, out, divergent)
            else:
                out.append(f"{pad}  if ({var} < {extent}) {{")
                self._stmt(s.body, depth + 2, out, divergent or f"{var} < {extent}")
                out.append(f"{pad}  }}")
            out.append(f"{pad}}}")
            return
        if free_vars(s.extent) & self.thread_vars:
            divergent = divergent or f"for ({var} < {extent})"
        if s.kind == ForKind.UNROLLED or isinstance(s.extent, Const) and s.var in _local_index_vars(s.body):
            # a thread's array stays in registers only if every index into it is a constant after
            # unrolling; a loop left rolled put a 32-float register tile in local memory (ptxas: stack)
            out.append(f"{pad}#pragma unroll")
        self.nonneg_vars.add(s.var)
        out.append(f"{pad}for ({self.index_type} {var} = 0; {var} < {extent}; ++{var}) {{")
        self._stmt(s.body, depth + 1, out, divergent)
        out.append(f"{pad}}}")

    # ---- expressions --------------------------------------------------------------------------

    def _value_as(self, e: Expr, dtype: str) -> str:
        text = self._expr(e)
        return f"({c_type(dtype)})({text})" if e.dtype != dtype or dtype == "bool" else text

    def _expr(self, e: Expr) -> str:
        if isinstance(e, Var):
            return self.names.var(e)
        if isinstance(e, Const):
            return _const(e)
        if isinstance(e, Binary):
            return self._binary(e)
        if isinstance(e, Compare):
            return f"({self._expr(e.a)} {_CMP[e.op]} {self._expr(e.b)})"
        if isinstance(e, Logical):
            if e.op == "not":
                return f"(!{self._expr(e.a)})"
            return f"({self._expr(e.a)} {'&&' if e.op == 'and' else '||'} {self._expr(e.b)})"  # type: ignore[arg-type]
        if isinstance(e, Select):
            # C's conditional evaluates one arm only, as the loop IR's Select requires (padding reads)
            return f"({self._expr(e.cond)} ? {self._expr(e.true_value)} : {self._expr(e.false_value)})"
        if isinstance(e, Cast):
            if e.dtype == "bool":
                return f"(({self._expr(e.value)}) != 0)"
            return f"(({c_type(e.dtype)})({self._expr(e.value)}))"
        if isinstance(e, Reinterpret):
            return self._reinterpret(e)
        if isinstance(e, Call):
            return self._call(e)
        if isinstance(e, Load):
            return f"{self.names.buffer(e.buffer)}[{self._expr(e.buffer.flat_index(e.indices))}]"
        raise GPUCodegenError(f"expression {type(e).__name__} has no GPU form")

    def _reinterpret(self, e: Reinterpret) -> str:
        """A bit cast: between integers of one width a C cast keeps the bits (two's complement); to or from
        a float, CUDA's __float_as_int family or OpenCL's as_<type> (the AOTC_AS_ macros of the preludes)."""
        x, src = self._expr(e.value), e.value.dtype
        if not is_float(src) and not is_float(e.dtype):
            return f"(({c_type(e.dtype)})({x}))"
        if is_float(e.dtype):
            if src not in ("int32", "uint32", "int64", "uint64"):
                raise GPUCodegenError(f"reinterpret of {src} as {e.dtype} has no GPU form")
            return f"AOTC_AS_{'float' if e.dtype == 'float32' else 'double'}({x})"
        name = {"int32": "int", "uint32": "uint", "int64": "long", "uint64": "ulong"}.get(e.dtype)
        if name is None or src not in ("float32", "float64"):
            raise GPUCodegenError(f"reinterpret of {src} as {e.dtype} has no GPU form")
        return f"AOTC_AS_{name}({x})"

    def _binary(self, e: Binary) -> str:
        a, b = self._expr(e.a), self._expr(e.b)
        f32 = e.dtype == "float32"
        if e.op == "add" and _is_zero(e.a) or e.op in ("add", "sub") and _is_zero(e.b):
            return b if _is_zero(e.a) else a
        if e.op in _INFIX:
            return f"({a} {_INFIX[e.op]} {b})"
        if is_float(e.dtype):
            if e.op == "div":
                return f"({a} / {b})"
            if e.op in ("min", "max"):
                return f"f{e.op}{'f' if f32 else ''}({a}, {b})"
            if e.op == "pow":
                return f"pow{'f' if f32 else ''}({a}, {b})"
            if e.op in ("floordiv", "floormod"):
                return f"aotc_{e.op}_{'f32' if f32 else 'f64'}({a}, {b})"
        else:
            t = c_type(e.dtype)
            if e.op in _BITWISE:
                if e.op == "bitxor" and isinstance(e.b, Const) and _all_ones(e.b):
                    return f"(({t})(~{a}))"  # not: no literal of 2**64 - 1, which C has no signed type for
                return f"(({t})({a} {_BITWISE[e.op]} {b}))"
            if e.op in ("min", "max"):
                return f"(({a}) {'<' if e.op == 'min' else '>'} ({b}) ? ({a}) : ({b}))"
            if e.op in ("floordiv", "div", "floormod"):
                if self._nonneg(e.a) and isinstance(e.b, Const) and int(e.b.value) > 0:
                    return self._unsigned_divide(e, a, int(e.b.value))
                fn = "aotc_floormod" if e.op == "floormod" else "aotc_floordiv"
                if e.dtype == "int64":
                    return f"{fn}({a}, {b})"
                return f"(({t}){fn}((i64)({a}), (i64)({b})))"
        raise GPUCodegenError(f"binary op {e.op} on {e.dtype} has no GPU form")

    def _unsigned_divide(self, e: Binary, a: str, b: int) -> str:
        """`a` (>= 0) divided by, or modulo, the constant `b` (> 0): C's truncating division is floor
        division there, and in unsigned arithmetic a power of two is a shift or a mask (64-bit signed
        division is a long software routine on GPUs). The result is signed again, as the IR's type."""
        op = "%" if e.op == "floormod" else "/"
        if e.dtype == "int64" and self.index_type == "int" and b < 2**31:
            return f"((int)((unsigned)({a}) {op} {b}u))"
        t = c_type(e.dtype)
        return f"(({t})((u64)({a}) {op} {b}ull))"

    def _nonneg(self, e: Expr) -> bool:
        """Whether integer `e` is >= 0 whatever the values of its variables (loop and thread indices,
        constants, and sums, products, quotients and remainders of them)."""
        if isinstance(e, Var):
            return e in self.nonneg_vars
        if isinstance(e, Const):
            return not is_float(e.dtype) and int(e.value) >= 0
        if isinstance(e, Binary) and not is_float(e.dtype):
            if e.op in ("add", "mul", "min", "max"):
                return self._nonneg(e.a) and self._nonneg(e.b)
            if e.op in ("floordiv", "div", "floormod"):
                return self._nonneg(e.a) and isinstance(e.b, Const) and int(e.b.value) > 0
        return False

    def _call(self, e: Call) -> str:
        if len(e.args) != 1:
            raise GPUCodegenError(f"math call {e.name} takes one argument, got {len(e.args)}")
        x = self._expr(e.args[0])
        dtype = e.args[0].dtype
        if not is_float(dtype):
            if e.name == "abs":
                return f"(({x}) < 0 ? -({x}) : ({x}))"
            raise GPUCodegenError(f"math call {e.name} needs a float argument, got {dtype}")
        f = "f" if dtype == "float32" else ""
        one = "1.0f" if f else "1.0"
        if e.name in ("exp", "log", "sqrt", "tanh", "erf", "floor", "ceil") or e.name in LIBM_ONLY:
            return f"{e.name}{f}({x})"
        if e.name == "abs":
            return f"fabs{f}({x})"
        if e.name == "round":
            return f"rint{f}({x})"  # round half to even, as numpy
        if e.name == "rsqrt":
            return f"({one} / sqrt{f}({x}))"
        if e.name == "sigmoid":
            return f"({one} / ({one} + exp{f}(-({x}))))"
        raise GPUCodegenError(f"unknown math call {e.name!r}")


def _all_ones(c: Const) -> bool:
    """Whether integer constant `c` has every bit of its type set (-1, or the unsigned maximum)."""
    return int(c.value) & ((1 << dtype_bits(c.dtype)) - 1) == (1 << dtype_bits(c.dtype)) - 1


def _const(e: Const) -> str:
    if e.dtype in ("float32", "float64"):
        v = float(e.value)
        suffix = "F32" if e.dtype == "float32" else "F64"
        if math.isnan(v):
            return f"AOTC_NAN_{suffix}"
        if math.isinf(v):
            return f"AOTC_INF_{suffix}" if v > 0 else f"(-AOTC_INF_{suffix})"
        return f"{v!r}f" if e.dtype == "float32" else repr(v)
    if e.dtype == "bool":
        return "1" if e.value else "0"
    if e.dtype == "int64" and -(2**31) < int(e.value) < 2**31:
        return str(int(e.value))  # an int literal; with an i64 operand C computes in 64 bits
    if int(e.value) >= 2**63:  # past every signed type: a decimal literal needs the unsigned suffix
        return f"(({c_type(e.dtype)}){int(e.value)}u)"
    return f"(({c_type(e.dtype)}){int(e.value)})"


# buffers and loops this small index in 32 bits with room to spare: an index computed for a padded or
# guarded iteration may exceed its buffer's size, by far less than this margin
_INT32_INDEX_LIMIT = 2**28


def _fits_int32_indices(root: Stmt, globals_: tuple[Buffer, ...], extent: dict[str, int]) -> bool:
    """Whether every index in a kernel fits 32-bit arithmetic: all buffers and loop extents are below
    `_INT32_INDEX_LIMIT` elements and the threads of the launch number fewer than 2^31. GPUs compute
    32-bit integers at full rate, 64-bit ones in two or more instructions."""
    if math.prod(extent.values()) >= 2**31:
        return False
    buffers = list(globals_)
    for s in walk_stmts(root):
        if isinstance(s, For) and not (isinstance(s.extent, Const) and s.extent.value < _INT32_INDEX_LIMIT):
            return False
        if isinstance(s, Allocate):
            buffers.append(s.buffer)
    return all(b.num_elements < _INT32_INDEX_LIMIT for b in buffers)


def _is_zero(e: Expr) -> bool:
    return isinstance(e, Const) and e.value == 0 and not is_float(e.dtype)


def _local_index_vars(root: Stmt) -> set[Var]:
    """The variables in the indices of thread-local (register) arrays that `root` reads or writes."""
    found: set[Var] = set()
    for s in walk_stmts(root):
        if isinstance(s, BufferStore) and s.buffer.scope == "local":
            found.update(*(free_vars(i) for i in s.indices))
        for e in _exprs_of(s):
            for n in walk(e):
                if isinstance(n, Load) and n.buffer.scope == "local":
                    found.update(*(free_vars(i) for i in n.indices))
    return found


def _buffers_of(s: Stmt) -> list[Buffer]:
    out = [s.buffer] if isinstance(s, BufferStore) else []
    out.extend(n.buffer for e in _exprs_of(s) for n in walk(e) if isinstance(n, Load))
    return out


def _exprs_of(s: Stmt) -> list[Expr]:
    """The expressions a statement itself holds (not those of the statements inside it)."""
    if isinstance(s, BufferStore):
        return [s.value, *s.indices]
    if isinstance(s, For):
        return [s.extent]
    if isinstance(s, IfThenElse):
        return [s.cond]
    if isinstance(s, LetStmt):
        return [s.value]
    return []


# ---- compilers and runners -------------------------------------------------------------------
# CUDA compiles through aotc.codegen.cuda_compiler (NVRTC, else nvcc); re-exported here.
__all__ = [
    "GPUCodegenError",
    "GPUCompileError",
    "GPUKernel",
    "GPUModule",
    "LaunchConfig",
    "build_opencl",
    "compile_cuda",
    "cuda_compiler_name",
    "emit_gpu",
    "gpu_source",
    "nvcc_path",
    "opencl_device",
    "run_opencl",
]


def opencl_device():
    """The first OpenCL device pyopencl finds (PoCL's CPU device on machines without a GPU), or None."""
    try:
        import pyopencl as cl
    except ImportError:
        return None
    try:
        platforms = cl.get_platforms()
    except cl.Error:
        return None
    for p in platforms:
        devices = p.get_devices()
        if devices:
            return devices[0]
    return None


def build_opencl(modules: list[GPUModule], device=None):
    """One OpenCL program (pyopencl) holding the kernels of `modules`, built for `device` (default: the
    first found); pass it to `run_opencl` to run several functions after one (slow) build."""
    import pyopencl as cl

    device = device if device is not None else opencl_device()
    if device is None:
        raise GPUCompileError("no OpenCL device found (install pocl-opencl-icd for a CPU one)")
    return cl.Program(cl.Context([device]), gpu_source(modules, "opencl")).build()


def run_opencl(module: GPUModule, inputs, device=None, program=None) -> list:
    """Run `module`'s kernels through pyopencl on `inputs` (numpy arrays, one per leading param), from
    `program` (`build_opencl`) or from a program built for `device` now.

    Returns the trailing params (the outputs) as numpy arrays. For tests.
    """
    import numpy as np
    import pyopencl as cl

    if program is None:
        program = build_opencl([module], device)
    ctx = program.context
    queue = cl.CommandQueue(ctx)
    mf = cl.mem_flags
    n_in = len(inputs)
    host: dict[int, np.ndarray] = {}
    dev: dict[int, object] = {}
    for i, b in enumerate(module.params):
        dtype = np.uint8 if b.dtype == "bool" else np.dtype(b.dtype)
        arr = np.ascontiguousarray(inputs[i], dtype=dtype) if i < n_in else np.zeros(b.shape, dtype)
        host[id(b)] = arr
        dev[id(b)] = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=arr)
    for b in module.workspace:
        dev[id(b)] = cl.Buffer(ctx, mf.READ_WRITE, size=max(1, b.num_elements * _ITEM_BYTES[b.dtype]))
    for k in module.kernels:
        local = k.launch.block
        global_size = tuple(g * t for g, t in zip(k.launch.grid, local))
        args = [a for b in k.params for a in (dev[id(b)], np.int64(0))]
        getattr(program, k.name)(queue, global_size, local, *args)
    outs = []
    for b in module.params[n_in:]:
        cl.enqueue_copy(queue, host[id(b)], dev[id(b)])
        outs.append(host[id(b)])
    queue.finish()
    return outs
