"""Errors every stage of a build may raise (bad recipes and inputs have their own, in their modules)."""

from __future__ import annotations

__all__ = ["BuildError"]


class BuildError(RuntimeError):
    """The model cannot be compiled (as opposed to a bad recipe or input file)."""
