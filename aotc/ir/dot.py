"""Dot-product micro-kernels: 8-bit products summed `depth` at a time into each 32-bit lane
(docs/int8.md#dot-product-micro-kernels).

A TENSORIZED loop of extent `depth` placed right inside a vectorized loop of `lanes` lanes, whose body
is `acc[i] = acc[i] + u * s` with `u` and `s` 32-bit widenings of 8-bit values, runs as one instruction
of a form the target has:

- `vnni`: AVX-512 VNNI / AVX-VNNI `vpdpbusd`, 4 unsigned x signed byte products per lane. `u` is a uint8
  value, or an int8 value plus 128 (read as `x ^ 0x80`: the graph moved 128 * sum(w) into the bias,
  so the sum stays exact); `s` is int8.
- `maddubs`: AVX2 `vpmaddubsw` then `vpmaddwd` by ones, vpdpbusd's 4 unsigned x signed byte products per
  lane in two instructions. vpmaddubsw adds pairs of products in int16 with saturation, so it is exact
  only where every signed factor is within +-64 (a pair then sums to at most 255 * 128 = 32640): the
  graph checked the constant weights and marked the op (aotc.te.tensor.NARROW_WEIGHTS: onnxruntime's
  `reduce_range` models), and only such an op's tensorized loops (`For.narrow`) may take this form.
- `maddwd`: AVX2 / AVX-512BW `vpmaddwd` on values widened to 16 bits, 2 products per lane; any 8-bit
  `u` and `s` (each product and the pair's sum fit 32 bits exactly), or int16 factors read as they are
  (the int8 Winograd conv's transformed data and weights: aotc.topi.winograd).
- `maddwd4`: AVX2 `vpmaddwd` twice on 4 bytes per lane, read in place as 16-bit values: the even bytes
  (masked, or shifted up and back) and the odd ones (shifted down), so each lane sums its 4 products
  exactly with no byte-widening shuffle; the operands are packed as vpdpbusd's.
- `usdot`: AArch64 `usdot` (FEAT_I8MM), vpdpbusd's unsigned x signed byte products on 4 NEON lanes.
- `sdot` / `udot`: AArch64 `sdot` / `udot` (FEAT_DotProd, e.g. Cortex-A55/A76, Neoverse N1): signed x
  signed or unsigned x unsigned byte products on 4 NEON lanes. A target with these but no unsigned x
  signed form gets a graph whose products have factors of matching signedness (`same_sign_only`).

A factor may be an 8-bit value with its top bit flipped: int8 + 128 is a uint8, uint8 - 128 an int8 (both
read as `x ^ 0x80`), which is how the graph gives a product the signedness its target's form reads.
The plain widening code stays the fallback: a schedule without the annotation.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from aotc.ir.expr import Binary, Buffer, Cast, Const, Expr, Load, Var, free_vars
from aotc.ir.simplify import linear_terms
from aotc.ir.stmt import BufferStore, For
from aotc.target import Target, cpu_features

BYTE_DTYPES = ("int8", "uint8")
WORD_DTYPE = "int16"  # the one 16-bit factor a form reads (vpmaddwd's), as it is
INT8_OFFSET = 128  # int8 + 128 is the uint8 that vpdpbusd reads; uint8 - 128 the int8 that sdot reads
# The factors' signedness a form reads: u unsigned and s signed, any, both signed, both unsigned.
SIGNS = ("us", "any", "ss", "uu")


@dataclass(frozen=True)
class DotForm:
    """One dot-product instruction: `depth` products per 32-bit lane, `lanes` lanes."""

    name: str  # "vnni", "maddubs", "maddwd4", "maddwd", "usdot", "sdot" or "udot"
    lanes: int
    depth: int
    intrinsic: str
    signs: str  # one of SIGNS: "us" for vpdpbusd and usdot (u8 x s8), "ss" sdot, "uu" udot
    widens: bool = False  # the operands are widened to 16 bits and the products' sums added to the acc
    narrow_only: bool = False  # exact only where the signed factors are within +-64 (maddubs)
    pairs_by: str = ""  # an intrinsic that sums the first's int16 pairs into the lanes (vpmaddwd by ones)
    halves: bool = False  # the intrinsic runs twice, on the even and on the odd bytes as 16-bit values

    @property
    def products_per_instruction(self) -> int:
        """The products one multiply instruction does (vpmaddubsw's 32; vpmaddwd's pairs, twice for 4)."""
        return self.lanes * self.depth // (2 if self.halves else 1)

    @property
    def operand_type(self) -> str:
        """The LLVM type of the intrinsic's two product operands."""
        return f"<{self.lanes * self.depth} x {'i16' if self.widens else 'i8'}>"


_FORMS = (
    # (instruction set, required features, form), widest first
    ("x86_64", ("avx512vnni",), DotForm("vnni", 16, 4, "llvm.x86.avx512.vpdpbusd.512", "us")),
    ("x86_64", ("avx512vnni", "avx512vl"), DotForm("vnni", 8, 4, "llvm.x86.avx512.vpdpbusd.256", "us")),
    ("x86_64", ("avxvnni",), DotForm("vnni", 8, 4, "llvm.x86.avx512.vpdpbusd.256", "us")),
    ("x86_64", ("avx512bw",), DotForm("maddwd", 16, 2, "llvm.x86.avx512.pmaddw.d.512", "any", True)),
    ("x86_64", ("avx2",), DotForm("maddwd4", 8, 4, "llvm.x86.avx2.pmadd.wd", "any", halves=True)),
    ("x86_64", ("avx2",), DotForm("maddwd", 8, 2, "llvm.x86.avx2.pmadd.wd", "any", True)),
    (
        "x86_64",
        ("avx2",),
        DotForm(
            "maddubs",
            8,
            4,
            "llvm.x86.avx2.pmadd.ub.sw",
            "us",
            narrow_only=True,
            pairs_by="llvm.x86.avx2.pmadd.wd",
        ),
    ),
    # usdot first: where both exist, a product of mixed signedness takes it, matching ones sdot/udot
    ("aarch64", ("i8mm",), DotForm("usdot", 4, 4, "llvm.aarch64.neon.usdot.v4i32.v16i8", "us")),
    ("aarch64", ("dotprod",), DotForm("sdot", 4, 4, "llvm.aarch64.neon.sdot.v4i32.v16i8", "ss")),
    ("aarch64", ("dotprod",), DotForm("udot", 4, 4, "llvm.aarch64.neon.udot.v4i32.v16i8", "uu")),
)


@functools.cache
def dot_forms(target: Target) -> tuple[DotForm, ...]:
    """The dot-product forms `target`'s code may use, each (name, lanes) once."""
    if not target.is_cpu:
        return ()
    feats = set(cpu_features(target))
    out: dict[tuple[str, int], DotForm] = {}
    for isa, required, form in _FORMS:
        if isa == target.isa and set(required) <= feats:
            out.setdefault((form.name, form.lanes), form)
    exact = [f for f in out.values() if not f.narrow_only]
    # A narrow-only form goes first where it does more products per instruction than every exact form
    # (AVX2's vpmaddwd: 16 on ymm); with VNNI, or AVX-512BW's vpmaddwd on zmm (32), it is pointless.
    narrow = [
        f
        for f in out.values()
        if f.narrow_only and all(e.products_per_instruction < f.products_per_instruction for e in exact)
    ]
    return (*narrow, *exact)


def usable_forms(forms: Sequence[DotForm], narrow: bool) -> tuple[DotForm, ...]:
    """`forms` less those exact only on narrow weights, unless the op's weights are (`narrow`)."""
    return tuple(f for f in forms if narrow or not f.narrow_only)


def has_narrow_forms(forms: Sequence[DotForm]) -> bool:
    """Whether a form among `forms` needs the graph to mark the ops whose weights are narrow."""
    return any(f.narrow_only for f in forms)


def same_sign_only(forms: Sequence[DotForm]) -> bool:
    """Whether `forms` read 8-bit factors of matching signedness but no unsigned x signed pair (AArch64
    `sdot`/`udot` without FEAT_I8MM's `usdot`): the graph then offsets a conv's or dense layer's input
    only where its signedness differs from the weight's (`mac_zero_point`), instead of making every int8
    input a uint8 (x + 128) for vpdpbusd/usdot. Targets with an unsigned x signed form, or with no form,
    keep the x + 128 graph, so their workloads (and tuned records) do not change."""
    if any(f.signs == "us" for f in forms):
        return False
    return any(f.signs in ("ss", "uu") for f in forms)


@dataclass(frozen=True)
class IntegerWinogradRule:
    """Which int8 3x3 convs run as integer Winograd (aotc.graph.passes): F(m, 3) for a tile m of `tiles`,
    the largest that holds first, where each output image has at least `min_tiles` m x m tiles (per image:
    a larger batch shares the weights, not the padding of a small image's last tiles)."""

    tiles: tuple[int, ...]
    min_tiles: int = 0


# With VNNI, the Winograd products (int16, vpmaddwd) run at half vpdpbusd's rate: F(4, 3) halves the
# direct conv's multiply instructions, F(2, 3) saves a tenth, and only a large image pays for the transforms
# and the int16 weights (8x the bytes, read again at every call). Measured on Zen 5 (znver5, 2 cores, 28
# November 2026, untuned, in QDQ ResNet-18's sequence), against the direct convs: 56x56 and 28x28 (196 and
# 49 tiles) 0.78-0.85x the time at 1 and 2 threads, 14x14 (16 tiles, 4.7 MB of weights) within 10% at 1 thread
# and 1.13-1.18x at 2, and 7x7 under F(2, 3) 1.7-1.9x.
VNNI_WINOGRAD_MIN_TILES = 49


def integer_winograd_rule(forms: Sequence[DotForm]) -> IntegerWinogradRule | None:
    """Where int8 3x3 convs run as integer Winograd (aotc.topi.winograd), on a target whose vpmaddwd reads
    its int16 operands; None where none does. Without VNNI (AVX2: vpmaddubsw + vpmaddwd by ones, 32 byte
    products in 2 instructions, as many as vpmaddwd's int16 ones in 1), F(4, 3)'s 36 products per 16
    outputs (F(2, 3): 16 per 4), where the direct conv does 144 (36), cost 4x (2.25x) fewer multiplies on
    every conv; with VNNI, F(4, 3) on large images only (VNNI_WINOGRAD_MIN_TILES)."""
    if not any(f.widens and f.signs == "any" for f in forms):
        return None
    if any(f.name == "vnni" for f in forms):
        return IntegerWinogradRule((4,), VNNI_WINOGRAD_MIN_TILES)
    return IntegerWinogradRule((4, 2))


@dataclass(frozen=True)
class Operand:
    """An 8-bit value read as an int32 factor: `value` (int8/uint8), with its top bit flipped where
    `offset` (int8 + 128, or uint8 - 128)."""

    value: Expr
    offset: bool

    @property
    def unsigned(self) -> bool:
        """The factor is a uint8 byte: a uint8 value, or an int8 one plus 128."""
        return (self.value.dtype == "uint8") != self.offset

    @property
    def word(self) -> bool:
        """The factor is an int16 value (no form but vpmaddwd's reads it)."""
        return self.value.dtype == WORD_DTYPE


@dataclass(frozen=True)
class DotBody:
    """`acc[indices] += u * s` of a tensorized loop."""

    acc: Buffer
    indices: tuple[Expr, ...]
    u: Operand
    s: Operand


def byte_operand(e: Expr) -> Operand | None:
    """`int32(x)`, `int32(x) + 128` with x int8 or `int32(x) - 128` with x uint8 (each as a subtraction
    or addition of the negated constant too), or `int32(x)` with x int16; None otherwise."""
    if isinstance(e, Cast) and e.dtype == "int32" and e.value.dtype in (*BYTE_DTYPES, WORD_DTYPE):
        return Operand(e.value, False)
    if isinstance(e, Binary) and e.op in ("add", "sub") and isinstance(e.b, Const):
        inner = byte_operand(e.a)
        shift = e.b.value if e.op == "add" else -e.b.value
        if inner is None or inner.offset or inner.word:
            return None
        want = INT8_OFFSET if inner.value.dtype == "int8" else -INT8_OFFSET
        if shift == want:
            return Operand(inner.value, True)
    return None


def dot_operands(product: Expr) -> tuple[Operand, Operand] | None:
    """(u, s) of an int32 product of two 8-bit (or int16) factors, the unsigned-capable one first."""
    if not (isinstance(product, Binary) and product.op == "mul" and product.dtype == "int32"):
        return None
    a, b = byte_operand(product.a), byte_operand(product.b)
    if a is None or b is None:
        return None
    if b.unsigned and not a.unsigned:
        a, b = b, a
    return a, b


def match_dot(loop: For, lane: Var) -> DotBody | str:
    """The dot product a tensorized `loop` (right inside the vector loop over `lane`) computes, or why
    it is none."""
    body = loop.body
    what = f"tensorized loop {loop.var.name}"
    if not isinstance(loop.extent, Const) or loop.extent.value != loop.max_extent:
        return f"{what} has no constant extent"
    if not isinstance(body, BufferStore):
        return f"{what}: its body is not one store (a guard or a nested loop)"
    value = body.value
    if body.buffer.dtype != "int32" or not (isinstance(value, Binary) and value.op == "add"):
        return f"{what}: its body is not an int32 accumulation"
    acc, product = value.a, value.b
    if not _is_acc(acc, body):
        acc, product = product, acc
    if not _is_acc(acc, body):
        return f"{what}: its body does not add to {body.buffer.name}"
    if any(loop.var in free_vars(i) for i in body.indices):
        return f"{what}: the accumulator {body.buffer.name} varies with the reduction"
    ops = dot_operands(product)
    if ops is None:
        return f"{what}: the product is not two widened 8-bit (or int16) values"
    return DotBody(body.buffer, body.indices, *ops)


def _is_acc(e: Expr, store: BufferStore) -> bool:
    return isinstance(e, Load) and e.buffer is store.buffer and e.indices == store.indices


def form_error(
    u: Operand, s: Operand, form: DotForm | None, lanes: int, depth: int, target_name: str
) -> str | None:
    """Why `form` cannot sum the products `u * s`, or None."""
    if form is None:
        return f"{target_name} has no dot-product instruction for {lanes} lanes of {depth} products"
    if (u.word or s.word) and not (form.widens and form.signs == "any"):
        return f"{form.name} reads 8-bit factors, not int16 ones"
    if form.signs == "us" and not u.unsigned:
        return f"{form.name} needs one unsigned factor (uint8, or int8 + 128)"
    if form.signs == "us" and s.unsigned:
        return f"{form.name} needs a signed second factor (int8, or uint8 - 128)"
    if form.signs == "ss" and (u.unsigned or s.unsigned):
        return f"{form.name} needs two signed factors (int8, or uint8 - 128)"
    if form.signs == "uu" and not (u.unsigned and s.unsigned):
        return f"{form.name} needs two unsigned factors (uint8, or int8 + 128)"
    return None


def affine_offset(buf: Buffer, indices: tuple[Expr, ...], lane: Var, r: Var) -> tuple[int, int] | None:
    """(lane coefficient, r coefficient) of the flat offset of `buf[indices]` when it is affine in them
    with nothing else depending on them; None otherwise."""
    terms, _ = linear_terms(buf.flat_index(indices))
    cl, cr = terms.pop(lane, 0), terms.pop(r, 0)
    if any(lane in free_vars(a) or r in free_vars(a) for a in terms):
        return None
    return cl, cr


def tensorized_dot(
    loop: For, lane: Var, lanes: int, forms: tuple[DotForm, ...]
) -> tuple[DotBody, DotForm] | str:
    """The dot product a tensorized `loop` right inside a vector loop over `lane` (`lanes` lanes) computes
    and the form among `forms` that runs it, or why there is none (search legality and codegen alike)."""
    dot = match_dot(loop, lane)
    if isinstance(dot, str):
        return dot
    depth = loop.max_extent
    forms = usable_forms(forms, loop.narrow)
    shaped = [f for f in forms if f.lanes == lanes and f.depth == depth]
    # the first form of this shape that reads these factors (usdot before sdot/udot); else the first's error
    form = next((f for f in shaped if form_error(dot.u, dot.s, f, lanes, depth, "") is None), None)
    err = form_error(dot.u, dot.s, form or (shaped[0] if shaped else None), lanes, depth, "the target")
    if err:
        return f"tensorized loop {loop.var.name}: {err}"
    assert form is not None
    return dot, form
