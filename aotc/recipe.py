"""Recipe schema and loader: a YAML file that says what to compile, for which target, and how to tune it.

Every error names the recipe file, the line and the key path (``tuning.deadline``, ``inputs.x.shape[1]``).
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from aotc.frontend.options import DEFAULT_REQUANTIZE, REQUANTIZE_CHOICES
from aotc.search.model_tuning import (
    MAX_TRIALS,
    TuningOptions,
    cluster_address_problem,
    duration_problem,
    parse_duration,
)
from aotc.target import TargetError, check_features_checkable, parse_target

DEFAULT_TARGET = "llvm -mcpu=native"
DTYPES = ("float32", "float16", "float64", "int8", "uint8", "int16", "int32", "int64", "bool")
MODEL_SUFFIXES = (".onnx", ".tflite")

_TOP_KEYS = (
    "model",
    "inputs",
    "target",
    "output",
    "tuning",
    "validate",
    "winograd",
    "nhwc",
    "weights",
    "memory_limit",
    "requantize",
    "constants",
)
# compact: each weight stored once in its smallest form, Winograd transforms computed when the package
# loads (CPU targets); prepacked: stored as the kernels read them (larger package, faster load)
WEIGHTS_MODES = ("compact", "prepacked")
_INPUT_KEYS = ("shape", "dtype")
_TUNING_KEYS = ("trials", "deadline", "records", "tophub", "transfer", "cluster")
_TAG = "tag:yaml.org,2002:"
_TYPE_NAMES = {"str": "a string", "int": "an integer", "float": "a number", "bool": "a boolean"}
_TYPE_NAMES |= {"null": "null", "seq": "a list", "map": "a mapping", "timestamp": "a date"}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SIZE_UNITS |= {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
MAX_MEMORY_LIMIT = 2**60


ConstantValue = Any
"""A value of the recipe's `constants`: a number, a (nested) list of numbers, a numpy array, or the Path of a
.npy file (a str or PathLike ending in .npy given to Recipe/aotc.compile becomes one)."""


def constant_value(value: Any, base: Path) -> ConstantValue:
    """A `constants` value as the Recipe holds it: a path to a .npy file resolved against `base` (and
    checked to exist), anything else as given; a string that names no .npy file is an error."""
    if isinstance(value, (str, os.PathLike)):
        path = (base / Path(os.fspath(value)).expanduser()).resolve()
        if path.suffix.lower() != ".npy":
            raise ValueError(f"expected a number, a list of numbers or a .npy file, got '{value}'")
        if not path.is_file():
            raise ValueError(f"no such file: {path}")
        return path
    return value


def load_constant(value: ConstantValue) -> Any:
    """The value a `constants` entry gives: a .npy file's array (read without pickles), else itself."""
    if isinstance(value, Path):
        import numpy as np

        try:
            return np.load(value, allow_pickle=False)
        except (OSError, ValueError) as err:
            raise ValueError(f"{value}: not a readable .npy file ({err})") from None
    return value


def constants_problem(constants: dict, model: Path) -> str | None:
    """Why `constants` does not fit `model`, or None: graph inputs are given values for ONNX models."""
    if constants and model.suffix.lower() != ".onnx":
        return "applies to ONNX models (values of their graph inputs)"
    return None


def requantize_problem(value: str, model: Path) -> str | None:
    """Why `requantize: value` does not fit `model`, or None. fixed_point is TFLite's builtin arithmetic:
    an ONNX model's quantized kernels requantize as onnxruntime's do (float) whatever the recipe says."""
    if value not in REQUANTIZE_CHOICES:
        return f"expected one of {', '.join(REQUANTIZE_CHOICES)}, got '{value}'"
    if value == "fixed_point" and model.suffix.lower() != ".tflite":
        return f"'{value}' applies to TFLite models; an ONNX model requantizes as onnxruntime does"
    return None


class RecipeError(ValueError):
    """A recipe problem, located as ``file:line: key.path: problem``."""

    def __init__(self, file: str, line: int | None, key: str | None, problem: str) -> None:
        self.file, self.line, self.key, self.problem = file, line, key, problem
        where = file if line is None else f"{file}:{line}"
        super().__init__(f"{where}: {key}: {problem}" if key else f"{where}: {problem}")


@dataclass(frozen=True)
class InputSpec:
    """An input's shape and dtype (None: the model's). A shape whose first entry lists batch sizes,
    `[[1, 4, 16], 64]`, compiles the model once per size into one package: `batch_sizes` holds them
    and `shape` is the first size's."""

    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    batch_sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        shape = self.shape
        if shape and isinstance(shape[0], (list, tuple)):
            sizes = tuple(int(b) for b in shape[0])
            object.__setattr__(self, "batch_sizes", sizes)
            object.__setattr__(self, "shape", (sizes[0], *(int(d) for d in shape[1:])) if sizes else ())
        sizes = self.batch_sizes
        if not sizes:
            return
        if any(b <= 0 for b in sizes) or len(set(sizes)) != len(sizes):
            raise ValueError(f"batch sizes {list(sizes)} must be distinct positive integers")
        if not self.shape or self.shape[0] != sizes[0]:
            raise ValueError(
                f"shape {list(self.shape or ())} does not start with the first batch size {sizes[0]}"
            )

    def at_batch(self, batch: int) -> InputSpec:
        """This input at one batch size: the shape with `batch` leading, no batch sizes."""
        return InputSpec((batch, *self.shape[1:]), self.dtype)

    def shape_json(self) -> list | None:
        """The shape as a recipe writes it: `[[1, 4], 16]` with batch sizes, else `[1, 16]`."""
        if self.shape is None:
            return None
        return [list(self.batch_sizes), *self.shape[1:]] if self.batch_sizes else list(self.shape)


@dataclass(frozen=True)
class Recipe:
    """What to compile, for which target, and how to tune it: read from a YAML file (`Recipe.from_yaml`)
    or made in Python. `output` defaults to build/<model stem>.aotc beside the recipe file (or the
    working directory when there is none); `path` is the recipe file, if any."""

    model: Path
    inputs: dict[str, InputSpec] = field(default_factory=dict)
    target: str = DEFAULT_TARGET
    output: Path | None = None
    tuning: TuningOptions = field(default_factory=TuningOptions)
    validate: bool = True
    winograd: bool = True
    nhwc: bool = True
    weights: str = "compact"  # one of WEIGHTS_MODES
    memory_limit: int | None = None  # bytes a run may need (workspace + weights + I/O); None: physical memory
    requantize: str = DEFAULT_REQUANTIZE  # a TFLite model's int8 conv/dense arithmetic (REQUANTIZE_CHOICES)
    # graph input -> its value, fixed at build time (an ONNX model's axes, pads, shapes, ...): a number, a
    # list of numbers, an array, or a .npy file (ConstantValue)
    constants: dict[str, ConstantValue] = field(default_factory=dict)
    path: Path | None = None

    def __post_init__(self) -> None:
        if self.weights not in WEIGHTS_MODES:
            raise ValueError(f"weights must be one of {', '.join(WEIGHTS_MODES)}, got {self.weights!r}")
        problem = requantize_problem(self.requantize, Path(self.model))
        if problem:
            raise ValueError(f"requantize: {problem}")
        model = Path(os.fspath(self.model)).expanduser().resolve()
        object.__setattr__(self, "model", model)
        problem = constants_problem(self.constants, model)
        if problem:
            raise ValueError(f"constants: {problem}")
        base = self.path.resolve().parent if self.path is not None else Path.cwd()
        constants = {}
        for name, value in self.constants.items():
            try:
                constants[name] = constant_value(value, base)
            except ValueError as err:
                raise ValueError(f"constants.{name}: {err}") from None
        object.__setattr__(self, "constants", constants)
        if self.output is None:
            base = self.path.resolve().parent if self.path is not None else Path.cwd()
            object.__setattr__(self, "output", base / "build" / f"{model.stem}.aotc")
        else:
            object.__setattr__(self, "output", Path(os.fspath(self.output)).expanduser().resolve())
        inputs = {name: _input_spec(spec) for name, spec in self.inputs.items()}
        object.__setattr__(self, "inputs", inputs)
        listed = {name: s.batch_sizes for name, s in inputs.items() if s.batch_sizes}
        if len(set(listed.values())) > 1:
            (a, x), (b, y) = list(listed.items())[:2]
            raise ValueError(f"inputs {a} and {b} list different batch sizes ({list(x)} and {list(y)})")

    def input_variants(self) -> list[dict[str, InputSpec]]:
        """The inputs of each variant the package holds: one per listed batch size (every input that
        lists sizes lists the same ones), else just `inputs`."""
        sizes = next((s.batch_sizes for s in self.inputs.values() if s.batch_sizes), ())
        if not sizes:
            return [self.inputs]
        return [{n: s.at_batch(b) if s.batch_sizes else s for n, s in self.inputs.items()} for b in sizes]

    @staticmethod
    def from_yaml(path: str | os.PathLike) -> Recipe:
        """Read, validate and resolve a recipe file; raises RecipeError on any problem."""
        return load_recipe(path)

    def to_dict(self) -> dict[str, Any]:
        """The resolved recipe: absolute paths, defaults filled, the target made concrete for this host."""
        return {
            "model": str(self.model),
            "inputs": {name: {"shape": s.shape_json(), "dtype": s.dtype} for name, s in self.inputs.items()},
            "target": str(parse_target(self.target)),
            "output": str(self.output),
            "tuning": {
                "trials": self.tuning.trials,
                "deadline": self.tuning.deadline,
                "records": None if self.tuning.records is None else str(self.tuning.records),
                "tophub": self.tuning.tophub,
                "transfer": self.tuning.transfer,
                "cluster": self.tuning.cluster,
            },
            "validate": self.validate,
            "winograd": self.winograd,
            "nhwc": self.nhwc,
            "weights": self.weights,
            "memory_limit": self.memory_limit,
            "requantize": self.requantize,
            "constants": {name: _constant_json(v) for name, v in self.constants.items()},
        }

    def constant_values(self) -> dict[str, Any]:
        """`constants` with each .npy file read (an error names the entry and the file)."""
        out = {}
        for name, value in self.constants.items():
            try:
                out[name] = load_constant(value)
            except ValueError as err:
                raise ValueError(f"constants.{name}: {err}") from None
        return out


def _constant_json(value: ConstantValue) -> Any:
    """A constants value as a recipe writes it: a .npy path as a string, an array as a list."""
    if isinstance(value, Path):
        return str(value)
    return value.tolist() if hasattr(value, "tolist") else value


def format_recipe(recipe: Recipe) -> str:
    """The resolved recipe as YAML (itself a loadable recipe); null tuning values mean the tuner's default."""
    body = yaml.safe_dump(recipe.to_dict(), sort_keys=False, default_flow_style=None, width=1 << 16)
    return f"# resolved from {recipe.path or 'Python'}\n{body}"


def _input_spec(spec: InputSpec | dict | tuple | list | None) -> InputSpec:
    """An input given as an InputSpec, {"shape": ..., "dtype": ...}, or a bare shape."""
    if isinstance(spec, InputSpec):
        return spec
    if spec is None:
        return InputSpec()
    if isinstance(spec, dict):
        shape = spec.get("shape")
        return InputSpec(None if shape is None else _dims(shape), spec.get("dtype"))
    return InputSpec(_dims(spec))


def _dims(shape: Sequence) -> tuple:
    """Dimensions as ints; a list in position 0 (batch sizes) stays a tuple of ints."""
    return tuple(tuple(int(b) for b in d) if isinstance(d, (list, tuple)) else int(d) for d in shape)


def load_recipe(path: str | os.PathLike) -> Recipe:
    """Read, validate and resolve a recipe file; raises RecipeError on any problem."""
    loader = _Loader(Path(path))
    return loader.load()


def parse_size(text: str | int) -> int | None:
    """Bytes in ``512MB``, ``64GiB``, ``1.5TB`` or a plain number of bytes; None when unparsable."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    m = _SIZE.fullmatch(str(text).strip())
    if m is None:
        return None
    value = float(m.group(1)) * _SIZE_UNITS[(m.group(2) or "").lower()]
    return int(value) if math.isfinite(value) else None


class _Loader:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = str(path)
        self.base = path.resolve().parent

    def fail(self, node: Node | None, key: str | None, problem: str) -> RecipeError:
        line = None if node is None else node.start_mark.line + 1
        return RecipeError(self.file, line, key, problem)

    def load(self) -> Recipe:
        root = self.compose()
        if not isinstance(root, MappingNode):
            raise self.fail(root, None, f"the top level must be a mapping of keys, got {_kind(root)}")
        entries = self.mapping(root, "", _TOP_KEYS)
        if "model" not in entries or _is_null(entries["model"]):
            raise self.fail(entries.get("model", root), "model", "required key is missing")
        model = self.model(entries["model"], "model")
        recipe = Recipe(
            path=self.path.resolve(),
            model=model,
            inputs=self.optional(entries, "inputs", self.inputs, {}),
            target=self.optional(entries, "target", self.target, DEFAULT_TARGET),
            output=self.optional(
                entries, "output", self.path_value, self.base / "build" / f"{model.stem}.aotc"
            ),
            tuning=self.optional(entries, "tuning", self.tuning, TuningOptions()),
            validate=self.optional(entries, "validate", self.boolean, True),
            winograd=self.optional(entries, "winograd", self.boolean, True),
            nhwc=self.optional(entries, "nhwc", self.boolean, True),
            weights=self.optional(entries, "weights", self.weights_mode, "compact"),
            memory_limit=self.optional(entries, "memory_limit", self.memory_limit, None),
            requantize=self.optional(
                entries, "requantize", lambda node, key: self.requantize(node, key, model), DEFAULT_REQUANTIZE
            ),
            constants=self.optional(
                entries, "constants", lambda node, key: self.constants(node, key, model), {}
            ),
        )
        self.check_outputs(recipe, entries, root)
        return recipe

    def check_outputs(self, recipe: Recipe, entries: dict[str, Node], root: Node) -> None:
        """The files a build writes (package, records) must not be a file it reads: writing the package
        over the model would destroy it."""
        reads = {"model": recipe.model, "the recipe itself": recipe.path}
        tuning = entries.get("tuning")
        tuning_entries = (
            self.mapping(tuning, "tuning", _TUNING_KEYS) if isinstance(tuning, MappingNode) else {}
        )
        for i, entry in enumerate(recipe.tuning.tophub or []):
            if "://" not in entry:
                reads[f"tuning.tophub[{i}]"] = Path(entry)
        writes = [("output", recipe.output, entries.get("output", root))]
        if recipe.tuning.records is not None:
            writes.append(("tuning.records", recipe.tuning.records, tuning_entries.get("records", root)))
        for key, path, node in writes:
            for what, read in reads.items():
                if same_file(path, read):
                    raise self.fail(node, key, f"{path} is also {what}: the build would overwrite it")
        if recipe.tuning.records is not None and same_file(recipe.output, recipe.tuning.records):
            raise self.fail(entries.get("output", root), "output", f"{recipe.output} is also tuning.records")

    def compose(self) -> Node:
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise RecipeError(self.file, None, None, f"cannot read recipe: {err}") from None
        try:
            root = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.MarkedYAMLError as err:
            raise RecipeError(self.file, *_syntax_error(err)) from None
        except yaml.YAMLError as err:
            raise RecipeError(self.file, None, None, f"YAML syntax error: {err}") from None
        if root is None or _is_null(root):
            raise RecipeError(self.file, 1, None, "the recipe is empty (it needs at least 'model: <file>')")
        return root

    def mapping(self, node: Node, where: str, allowed: tuple[str, ...]) -> dict[str, Node]:
        """Keys of a mapping node checked against `allowed`: no unknown, duplicate or non-scalar keys."""
        if not isinstance(node, MappingNode):
            raise self.fail(node, where, f"expected a mapping, got {_kind(node)}")
        out: dict[str, Node] = {}
        lines: dict[str, int] = {}
        for key_node, value in node.value:
            key = self.key(key_node, where)
            full = _join(where, key)
            if key in out:
                raise self.fail(key_node, None, f"duplicate key '{full}' (first at line {lines[key]})")
            if allowed and key not in allowed:
                raise self.fail(key_node, None, f"unknown key '{full}' ({_suggest(key, allowed)})")
            out[key] = value
            lines[key] = key_node.start_mark.line + 1
        return out

    def key(self, node: Node, where: str) -> str:
        if not isinstance(node, ScalarNode):
            raise self.fail(node, where or None, f"a key must be a plain name, got {_kind(node)}")
        return node.value

    def scalar(self, node: Node, key: str, expected: str, *tags: str) -> Any:
        """The Python value of a scalar node whose YAML type is one of `tags`."""
        if not isinstance(node, ScalarNode) or node.tag not in {_TAG + t for t in tags}:
            raise self.fail(node, key, f"expected {expected}, got {_describe(node)}")
        try:
            return SafeConstructor().construct_object(node)
        except yaml.YAMLError as err:
            raise self.fail(node, key, f"bad value: {err}") from None

    def optional(
        self,
        entries: dict[str, Node],
        key: str,
        parse: Callable[[Node, str], Any],
        default: Any,
        where: str = "",
    ) -> Any:
        """`parse` applied to the value of `key`, or `default` when the key is absent or null."""
        node = entries.get(key)
        return default if node is None or _is_null(node) else parse(node, _join(where, key))

    def string(self, node: Node, key: str) -> str:
        value = self.scalar(node, key, "a string", "str")
        if not value.strip():
            raise self.fail(node, key, "must not be empty")
        return value

    def boolean(self, node: Node, key: str) -> bool:
        return self.scalar(node, key, "a boolean (true or false)", "bool")

    def path_value(self, node: Node, key: str) -> Path:
        return (self.base / Path(self.string(node, key)).expanduser()).resolve()

    def model(self, node: Node, key: str) -> Path:
        path = self.path_value(node, key)
        if path.suffix.lower() not in MODEL_SUFFIXES:
            raise self.fail(node, key, f"unsupported model format '{path.name}' (expected .onnx or .tflite)")
        if not path.is_file():
            raise self.fail(node, key, f"model file not found: {path}")
        return path

    def target(self, node: Node, key: str) -> str:
        text = self.string(node, key)
        try:
            check_features_checkable(parse_target(text))
        except TargetError as err:
            raise self.fail(node, key, f"invalid target: {err}") from None
        return text.strip()

    def inputs(self, node: Node, key: str) -> dict[str, InputSpec]:
        entries = self.mapping(node, key, ())
        specs = {name: self.input_spec(value, _join(key, name)) for name, value in entries.items()}
        listed = [(name, s.batch_sizes) for name, s in specs.items() if s.batch_sizes]
        for name, sizes in listed[1:]:
            if sizes != listed[0][1]:
                raise self.fail(
                    entries[name],
                    _join(key, name) + ".shape[0]",
                    f"batch sizes {list(sizes)} differ from {listed[0][0]}'s {list(listed[0][1])}; "
                    "every input that lists batch sizes lists the same ones",
                )
        return specs

    def input_spec(self, node: Node, key: str) -> InputSpec:
        entries = self.mapping(node, key, _INPUT_KEYS)
        return InputSpec(
            shape=self.optional(entries, "shape", self.shape, None, key),
            dtype=self.optional(entries, "dtype", self.dtype, None, key),
        )

    def shape(self, node: Node, key: str) -> tuple[int, ...]:
        if not isinstance(node, SequenceNode):
            raise self.fail(
                node, key, f"expected a list of dimensions like [1, 3, 224, 224], got {_describe(node)}"
            )
        dims: list = []
        for i, item in enumerate(node.value):
            if i == 0 and isinstance(item, SequenceNode):
                dims.append(self.batch_sizes(item, f"{key}[0]"))
                continue
            dim = self.scalar(item, f"{key}[{i}]", "a positive integer dimension", "int")
            if dim <= 0:
                raise self.fail(item, f"{key}[{i}]", f"a dimension must be a positive integer, got {dim}")
            dims.append(dim)
        return tuple(dims)

    def batch_sizes(self, node: SequenceNode, key: str) -> tuple[int, ...]:
        """A list of batch sizes in position 0 of a shape: distinct positive integers, at least one."""
        if not node.value:
            raise self.fail(node, key, "a list of batch sizes needs at least one, like [1, 4, 16]")
        sizes: list[int] = []
        for i, item in enumerate(node.value):
            size = self.scalar(item, f"{key}[{i}]", "a positive integer batch size", "int")
            if size <= 0:
                raise self.fail(item, f"{key}[{i}]", f"a batch size must be a positive integer, got {size}")
            if size in sizes:
                raise self.fail(item, f"{key}[{i}]", f"batch size {size} is listed twice")
            sizes.append(size)
        return tuple(sizes)

    def dtype(self, node: Node, key: str) -> str:
        value = self.string(node, key)
        if value not in DTYPES:
            raise self.fail(node, key, f"unsupported dtype '{value}' ({_suggest(value, DTYPES)})")
        return value

    def tuning(self, node: Node, key: str) -> TuningOptions:
        entries = self.mapping(node, key, _TUNING_KEYS)
        return TuningOptions(
            trials=self.optional(entries, "trials", self.trials, None, key),
            deadline=self.optional(entries, "deadline", self.deadline, None, key),
            records=self.optional(entries, "records", self.path_value, None, key),
            tophub=self.optional(entries, "tophub", self.tophub, None, key),
            transfer=self.optional(entries, "transfer", self.boolean, TuningOptions.transfer, key),
            cluster=self.optional(entries, "cluster", self.cluster_address, None, key),
        )

    def cluster_address(self, node: Node, key: str) -> str:
        value = self.string(node, key).strip()
        problem = cluster_address_problem(value)
        if problem:
            raise self.fail(node, key, problem)
        return value

    def trials(self, node: Node, key: str) -> int:
        value = self.scalar(node, key, "an integer >= 0", "int")
        if not 0 <= value <= MAX_TRIALS:
            raise self.fail(
                node, key, f"expected an integer >= 0 (0 = no tuning) and <= {MAX_TRIALS}, got {value}"
            )
        return value

    def deadline(self, node: Node, key: str) -> float:
        hint = "use e.g. 90s, 45m, 1h30m, 2h, or a number of seconds"
        value = self.scalar(node, key, f"a duration ({hint})", "str", "int", "float")
        seconds = parse_duration(value) if isinstance(value, str) else float(value)
        if seconds is None and isinstance(value, str):
            raise self.fail(node, key, f"cannot parse duration '{value}' ({hint})")
        problem = duration_problem(seconds)
        if problem:
            raise self.fail(node, key, f"the deadline must be a positive duration, got '{value}' ({problem})")
        return seconds

    def weights_mode(self, node: Node, key: str) -> str:
        value = self.string(node, key)
        if value not in WEIGHTS_MODES:
            raise self.fail(node, key, f"expected one of {', '.join(WEIGHTS_MODES)}, got '{value}'")
        return value

    def requantize(self, node: Node, key: str, model: Path) -> str:
        value = self.string(node, key)
        problem = requantize_problem(value, model)
        if problem:
            raise self.fail(node, key, problem)
        return value

    def constants(self, node: Node, key: str, model: Path) -> dict[str, ConstantValue]:
        """graph input -> a number, a list of numbers (nested for more dimensions), or a .npy file path
        (relative to the recipe), read here so that a bad file is reported at its line."""
        entries = self.mapping(node, key, ())
        problem = constants_problem(dict(entries), model)
        if problem:
            raise self.fail(node, key, problem)
        out = {}
        for name, value in entries.items():
            where = _join(key, name)
            if isinstance(value, ScalarNode) and value.tag == _TAG + "str":
                try:
                    out[name] = constant_value(value.value, self.base)
                    load_constant(out[name])
                except ValueError as err:
                    raise self.fail(value, where, str(err)) from None
            else:
                out[name] = self.numbers(value, where)
        return out

    def numbers(self, node: Node, key: str) -> Any:
        """A number, true/false, or a list of them (lists nested for more dimensions)."""
        if isinstance(node, SequenceNode):
            return [self.numbers(item, f"{key}[{i}]") for i, item in enumerate(node.value)]
        value = self.scalar(node, key, "a number, a list of numbers or a .npy file", "int", "float", "bool")
        return value

    def memory_limit(self, node: Node, key: str) -> int:
        hint = "use e.g. 64GB, 512GiB, or a number of bytes"
        value = self.scalar(node, key, f"a size ({hint})", "str", "int")
        size = parse_size(value)
        if size is None or not 0 < size <= MAX_MEMORY_LIMIT:
            raise self.fail(node, key, f"expected a positive size ({hint}), got '{value}'")
        return size

    def tophub(self, node: Node, key: str) -> list[str]:
        if isinstance(node, ScalarNode) and node.tag == _TAG + "str" and node.value.strip().lower() == "none":
            return []
        if not isinstance(node, SequenceNode):
            raise self.fail(node, key, f"expected a list of paths or URLs, or 'none', got {_describe(node)}")
        return [self.tophub_entry(item, f"{key}[{i}]") for i, item in enumerate(node.value)]

    def tophub_entry(self, node: Node, key: str) -> str:
        value = self.string(node, key).strip()
        return value if "://" in value else str(self.path_value(node, key))


def same_file(a: Path, b: Path) -> bool:
    """True when `a` and `b` name one file: the same resolved path, or (both existing) the same inode."""
    if a.resolve() == b.resolve():
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _is_null(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.tag == _TAG + "null"


def _kind(node: Node | None) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    tag = "" if node is None else node.tag.removeprefix(_TAG)
    return _TYPE_NAMES.get(tag, f"a value tagged {tag!r}")


def _describe(node: Node) -> str:
    kind = _kind(node)
    return f"{kind} '{node.value}'" if isinstance(node, ScalarNode) and node.value else kind


def _suggest(word: str, choices: tuple[str, ...]) -> str:
    """A did-you-mean for the closest choice (ties go to the earlier one), else the list of choices."""
    ratio = {c: difflib.SequenceMatcher(None, word, c).ratio() for c in choices}
    best = max(choices, key=ratio.__getitem__)
    return f"did you mean '{best}'?" if ratio[best] >= 0.6 else f"expected one of: {', '.join(choices)}"


def _syntax_error(err: yaml.MarkedYAMLError) -> tuple[int | None, None, str]:
    mark = err.problem_mark or err.context_mark
    problem = f"YAML syntax error: {err.problem or err.context or 'cannot parse'}"
    if err.context and err.context_mark and err.problem_mark:
        problem += f" ({err.context} started at line {err.context_mark.line + 1})"
    return (None if mark is None else mark.line + 1), None, problem
