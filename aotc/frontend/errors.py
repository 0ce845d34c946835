"""Errors of the model frontends; all are ValueErrors whose message names the model and the culprit."""

from __future__ import annotations


class FrontendError(ValueError):
    """A model the frontend cannot turn into a Graph."""


class ModelLoadError(FrontendError):
    """The file is not a readable model of the expected format."""


class UnsupportedOpsetError(FrontendError):
    """The model's operator set version is outside the supported range."""


class UnsupportedOperatorError(FrontendError):
    """Operators with no mapping; `operators` maps each op type to the names of its nodes."""

    def __init__(self, model: str, operators: dict[str, list[str]]):
        self.model = model
        self.operators = dict(sorted(operators.items()))
        listed = ", ".join(f"{op} (nodes: {', '.join(names)})" for op, names in self.operators.items())
        count = len(self.operators)
        super().__init__(f"{model}: {count} unsupported operator{'s' if count != 1 else ''}: {listed}")


class DynamicShapeError(FrontendError):
    """A graph input has a dimension that is not fixed by the model or by the given input shapes."""


class InputShapeError(FrontendError):
    """Given input shapes name an unknown input or contradict the model."""


class ConversionError(FrontendError):
    """A supported operator with attributes, inputs or shapes the frontend cannot map."""
