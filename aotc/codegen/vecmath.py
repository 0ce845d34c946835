"""Vector math through glibc's libmvec (x86-64) and per-lane splitting of wide vectors.

A built package links libm (and libmvec where it calls a vector variant): exp, log, tanh and pow are LLVM
intrinsics (lowered to libm calls), erf and the trigonometric and hyperbolic functions (LIBM_ONLY) are
called in libm itself, lane by lane, where libmvec has no variant for the target. glibc's functions reduce
arguments exactly (sinf/cosf/tanf of 1e30 included); its libmvec variants are within 4 ulp.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from aotc.target import Target, cpu_features

LIBMVEC_PATH = "/lib/x86_64-linux-gnu/libmvec.so.1"

LIBM_ONLY = frozenset(
    {"sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh"}
)
"""Math calls emitted as libm calls (sinf, sin, ...) for scalars: not every LLVM has intrinsics for them."""

# glibc >= 2.35 for tanh, erf and LIBM_ONLY's vector variants (2.22 for exp, log, pow, sin, cos)
_LIBMVEC_FUNCS = {"exp": 1, "log": 1, "tanh": 1, "erf": 1, "pow": 2} | dict.fromkeys(LIBM_ONLY, 1)
_ISA_BYTES = {"b": 16, "c": 32, "d": 32, "e": 64}


@dataclass(frozen=True, slots=True)
class VecLib:
    """The libmvec ISA variants usable on a target, widest first."""

    isas: tuple[str, ...]

    def supports(self, fn: str, dtype: str) -> bool:
        return fn in _LIBMVEC_FUNCS and dtype in ("float32", "float64")

    def plan(self, dtype: str, lanes: int) -> tuple[str, int]:
        """(ISA letter, lanes per call) for a `lanes`-wide vector of `dtype`."""
        elem = 4 if dtype == "float32" else 8
        for isa in self.isas:
            if _ISA_BYTES[isa] // elem <= lanes:
                return isa, _ISA_BYTES[isa] // elem
        return self.isas[-1], _ISA_BYTES[self.isas[-1]] // elem

    @staticmethod
    def symbol(fn: str, dtype: str, isa: str, width: int) -> str:
        suffix = "f" if dtype == "float32" else ""
        return f"_ZGV{isa}N{width}{'v' * _LIBMVEC_FUNCS[fn]}_{fn}{suffix}"


def veclib_for(target: Target) -> VecLib | None:
    """libmvec variants for an x86-64 Linux target whose objects are linked on this host."""
    triple = target.triple
    if not triple.startswith("x86_64") or "linux" not in triple or not os.path.exists(LIBMVEC_PATH):
        return None
    # each variant needs its ISA: "e" AVX-512F, "d" AVX2 with FMA, "c" AVX, "b" SSE2 (the x86-64 baseline)
    feats = set(cpu_features(target))
    if "avx512f" in feats:
        return VecLib(("e", "d", "b"))
    if {"avx2", "fma"} <= feats:
        return VecLib(("d", "b"))
    if "avx" in feats:
        return VecLib(("c", "b"))
    return VecLib(("b",))
