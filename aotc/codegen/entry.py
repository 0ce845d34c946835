"""The whole-graph entry function: one exported C function that calls a model's kernels in order.

`int32_t aotc_run(void **inputs, void **outputs, uint8_t *weights, uint8_t *workspace)` builds each
kernel's `void *args[]` on the stack from those four base pointers and returns the first nonzero
kernel status, or 0. Given a plan (the canonical JSON of `aotc_runtime.plan`), the module also holds it,
NUL-terminated, in the ELF section `.aotc_plan`, where the runtime reads it from the library's bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from aotc_runtime.plan import PLAN_SECTION

from aotc.codegen.irbuilder import string_const
from aotc.target import Target

__all__ = ["BUFFER_KINDS", "ENTRY_SYMBOL", "BufferRef", "KernelCall", "build_entry_ir"]

ENTRY_SYMBOL = "aotc_run"
BUFFER_KINDS = ("input", "output", "weight", "workspace")
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class BufferRef:
    """Where a kernel argument lives: `offset` bytes into model input/output `index`, the weights
    blob or the workspace (`index` is used by inputs and outputs only; `nbytes` 0 means unspecified)."""

    kind: str
    index: int = 0
    offset: int = 0
    nbytes: int = 0

    def __post_init__(self) -> None:
        if self.kind not in BUFFER_KINDS:
            raise ValueError(f"buffer kind {self.kind!r} is not one of {', '.join(BUFFER_KINDS)}")
        for field in ("index", "offset", "nbytes"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 0:
                raise ValueError(
                    f"{self.kind} buffer reference: {field} must be a non-negative int, got {value!r}"
                )

    def to_json(self) -> dict:
        return {"kind": self.kind, "index": self.index, "offset": self.offset, "nbytes": self.nbytes}

    @staticmethod
    def from_json(d: dict) -> BufferRef:
        return BufferRef(d["kind"], d.get("index", 0), d.get("offset", 0), d.get("nbytes", 0))


@dataclass(frozen=True)
class KernelCall:
    """One step of the execution plan: call kernel `symbol` with `args` (one per kernel param)."""

    symbol: str
    args: tuple[BufferRef, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", tuple(self.args))

    def to_json(self) -> dict:
        return {"kernel": self.symbol, "args": [a.to_json() for a in self.args]}

    @staticmethod
    def from_json(d: dict) -> KernelCall:
        return KernelCall(d["kernel"], tuple(BufferRef.from_json(a) for a in d["args"]))


def build_entry_ir(
    calls: list[KernelCall],
    target: Target,
    num_inputs: int,
    num_outputs: int,
    plan: bytes = b"",
    symbol: str = ENTRY_SYMBOL,
    weights_only: bool = False,
) -> str:
    """LLVM IR text of a module defining the entry `symbol` (`aotc_run`; a package of several input
    shapes has one entry each) and declaring every kernel it calls; a non-empty `plan` goes into the
    `.aotc_plan` section. `weights_only`: `int32_t symbol(uint8_t *weights)`, calls on weights alone
    (`aotc_prepare`, which computes derived weights when a package loads)."""
    _check_calls(calls, num_inputs, num_outputs)
    if weights_only and any(ref.kind != "weight" for c in calls for ref in c.args):
        raise ValueError(f"{symbol} takes the weights alone, but a call passes another buffer")
    max_args = max((len(c.args) for c in calls), default=0)
    body = ["entry:"]
    if max_args:
        body.append(f"  %argv = alloca [{max_args} x ptr], align 16")
    for i, call in enumerate(calls):
        body.extend(_emit_call(i, call))
    body.append("  ret i32 0")
    symbols = list(dict.fromkeys(c.symbol for c in calls))
    decls = [f'declare i32 @"{s}"(ptr) nounwind' for s in symbols]
    if not _NAME_RE.match(symbol):
        raise ValueError(f"entry symbol {symbol!r} is not a usable C identifier")
    params = "ptr %weights" if weights_only else "ptr %inputs, ptr %outputs, ptr %weights, ptr %workspace"
    header = f"define i32 @{symbol}({params}) #0 {{"
    return "\n".join(
        [
            f'target triple = "{target.triple}"',
            "",
            *_plan_globals(plan),
            *decls,
            "",
            header,
            *body,
            "}",
            "",
            "attributes #0 = { nounwind }",
            "",
        ]
    )


def _plan_globals(plan: bytes) -> list[str]:
    """The plan as an internal constant in its own section, kept by `llvm.used` though nothing reads it."""
    if not plan:
        return []
    text, n = string_const(plan)
    return [
        f'@__aotc_plan = internal constant [{n} x i8] {text}, section "{PLAN_SECTION}", align 1',
        '@llvm.used = appending global [1 x ptr] [ptr @__aotc_plan], section "llvm.metadata"',
        "",
    ]


def _check_calls(calls: list[KernelCall], num_inputs: int, num_outputs: int) -> None:
    limits = {"input": num_inputs, "output": num_outputs}
    for i, call in enumerate(calls):
        if not _NAME_RE.match(call.symbol) or call.symbol == ENTRY_SYMBOL:
            raise ValueError(f"call {i}: kernel symbol {call.symbol!r} is not a usable C identifier")
        for j, ref in enumerate(call.args):
            limit = limits.get(ref.kind)
            if limit is not None and ref.index >= limit:
                raise ValueError(
                    f"call {i} ({call.symbol}) argument {j}: {ref.kind} index {ref.index} is out of range "
                    f"(the model has {limit} {ref.kind}s)"
                )


def _emit_call(i: int, call: KernelCall) -> list[str]:
    lines = []
    for j, ref in enumerate(call.args):
        name = f"%a{i}.{j}"
        lines.extend(_pointer(name, ref))
        slot = f"%slot{i}.{j}"
        lines.append(f"  {slot} = getelementptr inbounds ptr, ptr %argv, i64 {j}")
        lines.append(f"  store ptr {name}, ptr {slot}")
    argv = "%argv" if call.args else "null"
    lines += [
        f'  %s{i} = call i32 @"{call.symbol}"(ptr {argv})',
        f"  %failed{i} = icmp ne i32 %s{i}, 0",
        f"  br i1 %failed{i}, label %fail{i}, label %ok{i}",
        f"fail{i}:",
        f"  ret i32 %s{i}",
        f"ok{i}:",
    ]
    return lines


def _pointer(name: str, ref: BufferRef) -> list[str]:
    """Instructions that compute the data pointer `name` of `ref`."""
    if ref.kind in ("input", "output"):
        table = "%inputs" if ref.kind == "input" else "%outputs"
        base = f"{name}.base"
        lines = [
            f"  {base}.slot = getelementptr inbounds ptr, ptr {table}, i64 {ref.index}",
            f"  {base} = load ptr, ptr {base}.slot",
        ]
    else:
        base = "%weights" if ref.kind == "weight" else "%workspace"
        lines = []
    lines.append(f"  {name} = getelementptr inbounds i8, ptr {base}, i64 {ref.offset}")
    return lines
