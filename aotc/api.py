"""The Python API: compile a model into a package, load it, tune one operator. The CLI calls these.

import aotc
pkg = aotc.compile("resnet18.onnx", target="llvm -mcpu=native",
                   tuning=aotc.TuningOptions(trials=2000, deadline="30m", records="r18.jsonl"))
pkg.save("resnet18.aotc")
model = aotc.load("resnet18.aotc")
y = model.run({"input": x})
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from aotc.build import BuildResult, build
from aotc.files import atomic_file
from aotc.frontend.options import DEFAULT_REQUANTIZE
from aotc.recipe import DEFAULT_TARGET, MODEL_SUFFIXES, ConstantValue, InputSpec, Recipe, same_file
from aotc.search.model_tuning import TuningOptions
from aotc.target import Target, parse_target

__all__ = ["Package", "compile"]


@dataclass
class Package:
    """A compiled model: the package file at `path` (a temporary one until saved, unless `compile` was
    given an output), its build report and what the build found."""

    path: Path
    result: BuildResult
    _scratch: object = field(default=None, repr=False)  # removes a temporary package's directory

    @property
    def report(self) -> Path | None:
        return self.result.report

    @property
    def validation(self) -> list[dict] | None:
        """Per output, the comparison with onnxruntime / LiteRT (None when not validated)."""
        return self.result.validation

    def save(self, path: str | os.PathLike) -> Path:
        """Copy the package to `path` (whole or not at all) and return that path."""
        target = Path(path).expanduser().resolve()
        if target != self.path:
            with open(self.path, "rb") as src, atomic_file(target) as dst:
                shutil.copyfileobj(src, dst)
        return target

    def load(self, **options):
        """The package loaded by `aotc_runtime.load` (same options)."""
        import aotc_runtime

        return aotc_runtime.load(str(self.path), **options)


def compile(  # noqa: A001 - the verb users expect, as in aotc.compile(...)
    model: str | os.PathLike | Recipe,
    target: str | Target = DEFAULT_TARGET,
    *,
    inputs: Mapping[str, InputSpec | dict | Sequence[int]] | None = None,
    tuning: TuningOptions | None = None,
    output: str | os.PathLike | None = None,
    validate: bool = True,
    winograd: bool = True,
    nhwc: bool = True,
    weights: str = "compact",
    memory_limit: int | None = None,
    requantize: str = DEFAULT_REQUANTIZE,
    constants: Mapping[str, ConstantValue] | None = None,
    sign_key: str | os.PathLike | None = None,
    resume: bool = False,
    explain_cache: bool = False,
    callbacks: Sequence[Callable] = (),
    log: Callable[[str], None] | None = None,
) -> Package:
    """Compile an ONNX or TFLite model (a path) for `target`, tuning it as `tuning` says (default: no
    tuning; stored records still apply), validating it against onnxruntime / LiteRT when `validate`.

    `model` may also be a Recipe (`Recipe.from_yaml("recipe.yaml")`), which then says everything but
    the build flags (`sign_key`, `resume`, `explain_cache`, `callbacks`, `log`). Without `output` the
    package is written to a temporary directory: `save` it where it belongs. Messages go to `log`, by
    default the `aotc.build` logger (INFO), so `logging` settings decide where they show. `requantize`
    says how a TFLite model's int8 kernels requantize (aotc.frontend.options.DEFAULT_REQUANTIZE).
    `constants` gives graph inputs of an ONNX model values fixed at build time, as the recipe key does
    (name -> a number, a list of numbers, a numpy array or a .npy path): what sets shapes (axes, pads,
    Reshape shapes, ...) must be known then; those inputs are not inputs of the package."""
    scratch = None
    if isinstance(model, Recipe):
        recipe = model
    else:
        path = Path(os.fspath(model)).expanduser().resolve()
        if path.suffix.lower() not in MODEL_SUFFIXES:
            raise ValueError(f"{path}: unsupported model format {path.suffix!r} (expected .onnx or .tflite)")
        if not path.is_file():
            raise FileNotFoundError(f"model file not found: {path}")
        if output is None:
            directory = Path(tempfile.mkdtemp(prefix="aotc-"))
            scratch = directory
            output = directory / f"{path.stem}.aotc"
        recipe = Recipe(
            model=path,
            inputs=dict(inputs or {}),
            target=str(parse_target(target) if isinstance(target, str) else target),
            output=Path(output),
            tuning=tuning or TuningOptions(),
            validate=validate,
            winograd=winograd,
            nhwc=nhwc,
            weights=weights,
            memory_limit=memory_limit,
            requantize=requantize,
            constants=dict(constants or {}),
        )
        check_outputs(recipe)
    result = build(
        recipe,
        log,
        resume=resume,
        explain_cache=explain_cache,
        callbacks=callbacks,
        sign_key=None if sign_key is None else Path(sign_key),
    )
    package = Package(result.package, result)
    if scratch is not None:
        package._scratch = weakref.finalize(package, shutil.rmtree, scratch, ignore_errors=True)
    return package


def check_outputs(recipe: Recipe) -> None:
    """Refuse a package or records path that is the model file: the build would overwrite it."""
    writes = {"output": recipe.output, "tuning.records": recipe.tuning.records}
    for key, path in writes.items():
        if path is not None and same_file(path, recipe.model):
            raise ValueError(f"{key} {path} is the model file: the build would overwrite it")
    if recipe.tuning.records is not None and same_file(recipe.output, recipe.tuning.records):
        raise ValueError(f"output {recipe.output} is also tuning.records")


def with_overrides(recipe: Recipe, **tuning_changes) -> Recipe:
    """The recipe with the given TuningOptions fields changed (None values are left as they are)."""
    changes = {k: v for k, v in tuning_changes.items() if v is not None}
    return replace(recipe, tuning=recipe.tuning.replace(**changes)) if changes else recipe


def tune(
    task, target: str | Target, options: TuningOptions | None = None, log: Callable[[str], None] | None = None
):
    """Tune one operator: `task` is a ComputeDAG (aotc.te, aotc.topi) or a SearchTask. Spends
    `options.trials` measurements (default 200), appending them to `options.records` when set, and
    returns the TuneResult (best schedule, its cost, the trials)."""
    from aotc.search.task import SearchTask

    options = options or TuningOptions(trials=200)
    if options.deadline is not None:
        raise ValueError(
            "aotc.tune spends a number of trials; TuningOptions.deadline applies to whole models"
        )
    target = parse_target(target) if isinstance(target, str) else target
    search_task = task if isinstance(task, SearchTask) else SearchTask(task, target)
    if search_task.target != target:
        raise ValueError(f"the task is for {search_task.target}, not {target}")
    with options.measurers(target) as open_measurer:
        return search_task.tune(
            options.trials if options.trials is not None else 200,
            records=options.records,
            params=options.search,
            measure_options=options.measure,
            log=log,
            open_measurer=open_measurer,
        )
