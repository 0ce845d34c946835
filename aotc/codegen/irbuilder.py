"""Textual LLVM IR construction: types, constants, function and module builders."""

from __future__ import annotations

import functools
import hashlib
import math
import re
from dataclasses import dataclass

import numpy as np

from aotc.ir.expr import dtype_bits, is_float, unique_name


class CodegenError(Exception):
    """A construct of the loop IR that the code generator cannot (or must not) compile."""


_SCALAR_TYPES = {
    "float16": "half",
    "float32": "float",
    "float64": "double",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint8": "i8",
    "uint16": "i16",
    "uint32": "i32",
    "uint64": "i64",
    "bool": "i1",
}


def scalar_type(dtype: str) -> str:
    """LLVM register type of one element of `dtype`."""
    try:
        return _SCALAR_TYPES[dtype]
    except KeyError:
        raise CodegenError(f"dtype {dtype!r} is not supported by the LLVM code generator") from None


def mem_type(dtype: str) -> str:
    """LLVM in-memory element type (bool is stored as one byte, like numpy)."""
    return "i8" if dtype == "bool" else scalar_type(dtype)


def vtype(elem: str, lanes: int) -> str:
    return elem if lanes == 0 else f"<{lanes} x {elem}>"


def elem_bytes(dtype: str) -> int:
    return 1 if dtype == "bool" else dtype_bits(dtype) // 8


def is_signed(dtype: str) -> bool:
    return dtype.startswith("int")


def _float_hex(value: float, dtype: str) -> str:
    if dtype == "float16":
        return f"0xH{int(np.float16(value).view(np.uint16)):04X}"
    if dtype == "float32" and math.isfinite(value):
        with np.errstate(over="ignore"):
            value = float(np.float32(value))
    return f"0x{int(np.float64(value).view(np.uint64)):016X}"


def const_text(value: int | float | bool, dtype: str) -> str:
    """Operand text of a scalar constant (without its type)."""
    if dtype == "bool":
        return "true" if value else "false"
    if is_float(dtype):
        return _float_hex(float(value), dtype)
    bits = dtype_bits(dtype)
    v = int(value) & ((1 << bits) - 1)
    if v >= 1 << (bits - 1):
        v -= 1 << bits
    return str(v)


def vector_const_text(values: list, dtype: str) -> str:
    elem = scalar_type(dtype)
    return "<" + ", ".join(f"{elem} {const_text(v, dtype)}" for v in values) + ">"


def splat_const_text(value: int | float | bool, dtype: str) -> str:
    return f"splat ({scalar_type(dtype)} {const_text(value, dtype)})"


def string_const(data: bytes) -> tuple[str, int]:
    """LLVM `c"..."` literal for bytes plus a NUL terminator, and its length."""
    data = data + b"\0"
    out = []
    for b in data:
        ch = chr(b)
        if 32 <= b < 127 and ch not in '"\\':
            out.append(ch)
        else:
            out.append(f"\\{b:02X}")
    return 'c"' + "".join(out) + '"', len(data)


@dataclass(frozen=True, slots=True)
class Val:
    """An SSA value or constant: `lanes == 0` is a scalar, else a `<lanes x T>` vector."""

    ref: str
    dtype: str
    lanes: int = 0
    const: int | float | bool | None = None

    @property
    def ty(self) -> str:
        return vtype(scalar_type(self.dtype), self.lanes)

    @property
    def typed(self) -> str:
        return f"{self.ty} {self.ref}"


def const_val(value: int | float | bool, dtype: str) -> Val:
    if type(value) is int:  # index and integer constants repeat across a kernel's unrolled copies
        return _int_const_val(value, dtype)
    return _const_val(value, dtype)


@functools.lru_cache(maxsize=4096)
def _int_const_val(value: int, dtype: str) -> Val:
    return _const_val(value, dtype)


def _const_val(value: int | float | bool, dtype: str) -> Val:
    if dtype == "bool":
        value = bool(value)
    elif is_float(dtype):
        value = float(value)
    else:
        bits = dtype_bits(dtype)
        value = int(value) & ((1 << bits) - 1)
        if is_signed(dtype) and value >= 1 << (bits - 1):
            value -= 1 << bits
    return Val(const_text(value, dtype), dtype, 0, value)


_INT_OPS = {"add", "sub", "mul", "shl", "ashr", "lshr", "and", "or", "xor", "sdiv", "udiv", "srem", "urem"}
_FLOAT_OPS = {"fadd", "fsub", "fmul", "fdiv", "frem", "fneg", "icmp", "fcmp", "select"}
_CAST_OPS = {"sext", "zext", "trunc", "sitofp", "uitofp", "fptosi", "fptoui", "fpext", "fptrunc"}
_VECTOR_OPS = {"getelementptr", "insertelement", "extractelement", "shufflevector"}
_PURE_OPCODES = frozenset(_INT_OPS | _FLOAT_OPS | _CAST_OPS | _VECTOR_OPS)


class FunctionBuilder:
    """Accumulates the basic blocks of one LLVM function as text."""

    def __init__(self, header: str) -> None:
        self.header = header
        self._n = 0
        self._entry_allocas: list[str] = []
        self._blocks: list[tuple[str, list[str]]] = []
        self.cur_label = ""
        self._cur: list[str] = []
        self.terminated = True
        self.start_block("entry")

    def tmp(self) -> str:
        self._n += 1
        return f"%t{self._n}"

    def label(self, hint: str) -> str:
        self._n += 1
        return f"{hint}{self._n}"

    def start_block(self, label: str) -> None:
        if not self.terminated:
            self.br(label)
        self._cur = []
        self._pure: dict[str, str] = {}
        self._blocks.append((label, self._cur))
        self.cur_label = label
        self.terminated = False

    def emit(self, line: str) -> None:
        if self.terminated:
            self.start_block(self.label("dead"))
        self._cur.append("  " + line)

    def op(self, text: str) -> str:
        """Emit `%tN = text`; a pure instruction repeated within a block reuses the first result."""
        pure = text.split(" ", 1)[0] in _PURE_OPCODES
        if pure and not self.terminated and text in self._pure:
            return self._pure[text]
        name = self.tmp()
        self.emit(f"{name} = {text}")
        if pure:
            self._pure[text] = name
        return name

    def br(self, label: str) -> None:
        self.emit(f"br label %{label}")
        self.terminated = True

    def cond_br(self, cond: str, then_label: str, else_label: str) -> None:
        self.emit(f"br i1 {cond}, label %{then_label}, label %{else_label}")
        self.terminated = True

    def ret(self, text: str) -> None:
        self.emit(f"ret {text}")
        self.terminated = True

    def alloca(self, elem: str, count: int, align: int) -> str:
        name = self.tmp()
        self._entry_allocas.append(f"  {name} = alloca {elem}, i64 {count}, align {align}")
        return name

    def render(self) -> str:
        lines = [self.header + " {"]
        for i, (label, body) in enumerate(self._blocks):
            lines.append(f"{label}:")
            if i == 0:
                lines.extend(self._entry_allocas)
            lines.extend(body)
        lines.append("}")
        return "\n".join(lines)


class ModuleBuilder:
    """Collects declarations, globals, functions and metadata of one module."""

    def __init__(self, size_type: str = "i64", dot_forms: tuple = (), convert_lanes: int = 0) -> None:
        self.size_type = size_type  # C's size_t on the target
        self.dot_forms = dot_forms  # the target's dot-product instructions (ir/dot.py's DotForm)
        # lanes of the target's float -> int32 conversion in the current rounding mode that gives a fixed
        # value where the result does not fit (x86 cvtps2dq: INT_MIN): 8 with AVX, 4 with SSE2, else 0
        self.convert_lanes = convert_lanes
        self.decls: dict[str, str] = {}
        self.globals: list[str] = []
        self.functions: list[str] = []
        self.metadata: list[str] = []
        self.finalizers: list[str] = []  # `void f()` functions run in order when the library is unloaded
        self.heap_slots: list[str] = []  # globals caching a heap block between calls (freed at unload)
        self.regions: list[str] = []  # the names of the parallel regions' functions (`StmtGen._outline`)
        self._md = 0
        self._names: set[str] = set()

    def declare(self, name: str, line: str) -> str:
        self.decls.setdefault(name, line)
        return f"@{name}"

    def heap_slot(self, name: str) -> str:
        """The global `@name` that caches a heap block between calls (freed when the library is unloaded),
        declared by its first caller: later callers of the same name share it."""
        slot = f"@{name}"
        if slot not in self.heap_slots:
            self._names.add(name)
            self.globals.append(f"{slot} = internal global ptr null, align 8")
            self.heap_slots.append(slot)
        return slot

    def intrinsic(self, name: str, ret: str, args: list[str], attrs: str = "") -> str:
        return self.declare(name, f"declare {ret} @{name}({', '.join(args)}){attrs}")

    def unique_name(self, base: str) -> str:
        return unique_name(base, self._names, ".")

    def md(self, body: str, distinct: bool = False) -> str:
        ref = f"!{self._md}"
        self._md += 1
        body = body.replace("SELF", ref)
        self.metadata.append(f"{ref} = {'distinct ' if distinct else ''}{body}")
        return ref

    def alias_scopes(self, domain: str, count: int) -> list[str]:
        """The suffixes that mark accesses to `count` buffers of one kernel (named `domain`) as never
        overlapping one another: `, !alias.scope !own, !noalias !others` for each buffer."""
        root = self.md(f'!{{SELF, !"{domain}"}}', distinct=True)
        scopes = [self.md(f'!{{SELF, {root}, !"b{i}"}}', distinct=True) for i in range(count)]
        suffixes = []
        for i, scope in enumerate(scopes):
            own = self.md(f"!{{{scope}}}")
            others = self.md("!{" + ", ".join(s for j, s in enumerate(scopes) if j != i) + "}")
            suffixes.append(_SCOPE_SUFFIX.format(own=own, others=others))
        return suffixes

    def render(self, triple: str) -> str:
        return self._render(
            triple, self.globals, list(self.decls.values()), self.functions, self.finalizers, self.metadata
        )

    def render_split(self, triple: str) -> tuple[str, list[str]]:
        """The module less its parallel regions that use none of its globals, and a module for each of
        those, its region named by the module's text: a region compiled for an earlier candidate has the
        same name and text, so that its object can be reused (`aotc.codegen.llvm.cached_object`)."""
        declared = {m.group(0) for line in self.decls.values() for m in _SYMBOL.finditer(line)}
        functions, decls = list(self.functions), list(self.decls.values())
        modules: dict[str, str] = {}
        for name in self.regions:
            own = f'@"{name}"'
            header = f"define internal void {own}("
            text = next(f for f in functions if f.startswith(header))
            if any(m.group(0) not in declared and m.group(0) != own for m in _SYMBOL.finditer(text)):
                continue  # it uses a global of this module (a cached heap block)
            body, metadata = _own_alias_scopes(text.replace(header, f"define hidden void {_REGION}(", 1))
            used = {m.group(0) for m in _SYMBOL.finditer(body)}
            own_decls = [d for d in self.decls.values() if _SYMBOL.search(d).group(0) in used]
            module = self._render(triple, [], own_decls, [body], [], metadata)
            symbol = f'@"aotc.region.{hashlib.sha1(module.encode()).hexdigest()[:20]}"'
            modules[symbol] = module.replace(_REGION, symbol)
            functions = [f.replace(own, symbol) for f in functions if f is not text]
            decls.append(f"declare hidden void {symbol}(ptr, i32, i32) #0")
        main = self._render(
            triple, self.globals, list(dict.fromkeys(decls)), functions, self.finalizers, self.metadata
        )
        return main, list(modules.values())

    def _render(
        self,
        triple: str,
        globals_: list[str],
        decls: list[str],
        functions: list[str],
        finalizers: list[str],
        metadata: list[str],
    ) -> str:
        parts = [f'target triple = "{triple}"', ""]
        parts.extend(globals_)
        functions = list(functions)
        if finalizers:
            parts.append(
                "@llvm.global_dtors = appending global [1 x { i32, ptr, ptr }] "
                "[{ i32, ptr, ptr } { i32 65535, ptr @aotc.fini, ptr null }]"
            )
            calls = "".join(f"  call void {f}()\n" for f in finalizers)
            functions.append(f"define internal void @aotc.fini() nounwind {{\n{calls}  ret void\n}}")
        parts.extend(decls)
        for fn in functions:
            parts.append("")
            parts.append(fn)
        parts.append("")
        parts.append("attributes #0 = { nounwind }")
        parts.extend(metadata)
        return "\n".join(parts) + "\n"


_SCOPE_SUFFIX = ", !alias.scope {own}, !noalias {others}"
_ACCESS_SCOPES = re.compile(r", !alias\.scope (![0-9]+), !noalias ![0-9]+")


def _own_alias_scopes(function: str) -> tuple[str, list[str]]:
    """`function` (a split region) with alias scopes of its own, one per buffer it accesses, numbered in the
    order it first accesses them, and their metadata. The kernel's scopes listed every buffer of the
    kernel, so the same region had another text (and was compiled again) in each candidate whose other
    stages had another number of buffers."""
    order: dict[str, int] = {}
    for m in _ACCESS_SCOPES.finditer(function):
        order.setdefault(m.group(1), len(order))
    if len(order) < 2:  # one buffer: nothing to tell apart (as a kernel with one buffer has no scopes)
        return _ACCESS_SCOPES.sub("", function), []
    n = len(order)
    metadata = ['!0 = distinct !{!0, !"region"}']
    metadata += [f'!{1 + i} = distinct !{{!{1 + i}, !0, !"b{i}"}}' for i in range(n)]
    suffixes = {}
    for own, i in order.items():
        own_list, others_list = 1 + n + 2 * i, 2 + n + 2 * i
        metadata.append(f"!{own_list} = !{{!{1 + i}}}")
        metadata.append(f"!{others_list} = !{{" + ", ".join(f"!{1 + j}" for j in range(n) if j != i) + "}")
        suffixes[own] = _SCOPE_SUFFIX.format(own=f"!{own_list}", others=f"!{others_list}")
    return _ACCESS_SCOPES.sub(lambda m: suffixes[m.group(1)], function), metadata


# Kernels and their parallel regions start on a cache line. LLVM would place a function at any 16-byte
# boundary after the code before it, so a kernel's hot loops fell across 64-byte lines differently in a
# package than in the candidate that tuning measured, and changed whenever another kernel of the package
# changed size (ResNet-18 on Zen 5: its 3x3 convs 0.57 -> 0.70 ms and 1.03 -> 1.19 ms in the model after
# the max pool's code shrank by 672 bytes; the same code, shifted by 32 bytes modulo 64).
KERNEL_ALIGNMENT = 64

_SYMBOL = re.compile(r'@(?:"[^"]*"|[-\w.$]+)')
_REGION = '@"aotc.region"'  # a split region's name while its module's text is hashed
