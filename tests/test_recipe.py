"""Recipe loading: a full recipe resolves with defaults, and every mistake is reported with file, line and key."""

from pathlib import Path

import pytest
import yaml

from aotc.recipe import InputSpec, RecipeError, TuningOptions, format_recipe, load_recipe, parse_duration
from aotc.target import parse_target

RECIPES = Path(__file__).resolve().parent.parent / "recipes"


@pytest.fixture
def write(tmp_path):
    """Write a recipe next to an (empty) models/m.onnx and return its path."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.onnx").write_bytes(b"")

    def _write(text: str, name: str = "recipe.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return _write


def _error(path: Path) -> RecipeError:
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    return info.value


def test_full_recipe(write, tmp_path):
    path = write(
        "model: models/m.onnx\n"
        "inputs:\n"
        "  x: {shape: [1, 64], dtype: float32}\n"
        "  mask: {dtype: bool}\n"
        "target: llvm -mcpu=skylake-avx512 -num-cores=4\n"
        "output: out/m.aotc\n"
        "tuning:\n"
        "  trials: 2000\n"
        "  deadline: 1h30m\n"
        "  records: tuning/m.jsonl\n"
        "  tophub: [hub, https://example.com/bundle.tophub]\n"
        "  transfer: false\n"
        "  cluster: head.lab:6379\n"
        "validate: false\n"
        "winograd: false\n"
        "nhwc: false\n"
    )
    r = load_recipe(path)
    assert r.path == path.resolve()
    assert r.model == tmp_path / "models" / "m.onnx"
    assert r.inputs == {"x": InputSpec((1, 64), "float32"), "mask": InputSpec(None, "bool")}
    assert r.target == "llvm -mcpu=skylake-avx512 -num-cores=4"
    assert r.output == tmp_path / "out" / "m.aotc"
    assert r.tuning == TuningOptions(
        2000,
        5400.0,
        tmp_path / "tuning" / "m.jsonl",
        [str(tmp_path / "hub"), "https://example.com/bundle.tophub"],
        transfer=False,
        cluster="head.lab:6379",
    )
    assert r.validate is False and r.winograd is False and r.nhwc is False


def test_defaults_are_resolved(write, tmp_path):
    r = load_recipe(write("model: models/m.onnx\n"))
    assert r.inputs == {} and r.tuning == TuningOptions() and r.validate is True
    assert r.target == "llvm -mcpu=native"
    assert r.output == tmp_path / "build" / "m.aotc"
    d = r.to_dict()
    assert d["target"] == str(parse_target("llvm -mcpu=native")) and "native" not in d["target"]
    assert d["model"] == str(tmp_path / "models" / "m.onnx")
    assert d["output"] == str(tmp_path / "build" / "m.aotc")
    assert d["validate"] is True and d["winograd"] is True and d["nhwc"] is True
    assert d["tuning"] == {
        "trials": None,
        "deadline": None,
        "records": None,
        "tophub": None,
        "transfer": True,
        "cluster": None,
    }
    assert r.tuning.transfer is True  # records of other CPUs of this ISA are measured here by default


def test_null_values_mean_default(write):
    r = load_recipe(write("model: models/m.onnx\ninputs:\ntuning:\ntarget: ~\nvalidate: null\n"))
    assert r.inputs == {} and r.tuning == TuningOptions() and r.target == "llvm -mcpu=native" and r.validate


def test_tophub_none_is_empty(write):
    assert load_recipe(write("model: models/m.onnx\ntuning: {tophub: none}\n")).tuning.tophub == []


def test_format_recipe_round_trips(write, tmp_path):
    r = load_recipe(
        write(
            "model: models/m.onnx\ninputs:\n  x: {shape: [2, 3]}\n"
            "tuning: {trials: 5, deadline: 90s, records: r.jsonl, tophub: none}\n"
        )
    )
    text = format_recipe(r)
    assert text.startswith(f"# resolved from {r.path}\n")
    assert yaml.safe_load(text) == r.to_dict()
    again = load_recipe(write(text, "printed.yaml"))
    assert (again.model, again.inputs, again.output, again.tuning) == (r.model, r.inputs, r.output, r.tuning)
    assert again.target == r.to_dict()["target"]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("45m", 2700),
        ("1h30m", 5400),
        ("2h", 7200),
        ("1h 2m 3s", 3723),
        ("1.5h", 5400),
        ("90", 90),
    ],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "45 minutes", "1m2h", "-5m", "m30"])
def test_parse_duration_rejects(text):
    assert parse_duration(text) is None


GOOD = "model: models/m.onnx\n"

ERRORS = [
    # (recipe text, line, key path, fragment of the problem)
    (GOOD + "tunning:\n  trials: 3\n", 2, "tunning", "unknown key 'tunning' (did you mean 'tuning'?)"),
    (GOOD + "tuning:\n  trails: 3\n", 3, "tuning.trails", "(did you mean 'trials'?)"),
    (GOOD + "zzz: 1\n", 2, "zzz", "expected one of: model, inputs, target, output, tuning, validate"),
    (GOOD + "inputs:\n  x: {shape: [1], dtyp: float32}\n", 3, "inputs.x.dtyp", "did you mean 'dtype'?"),
    (GOOD + "validate: maybe\n", 2, "validate", "expected a boolean"),
    (GOOD + "winograd: 1\n", 2, "winograd", "expected a boolean"),
    (GOOD + "nhwc: yes please\n", 2, "nhwc", "expected a boolean"),
    (GOOD + "target: 3\n", 2, "target", "expected a string, got an integer '3'"),
    (GOOD + "inputs: [x]\n", 2, "inputs", "expected a mapping, got a list"),
    (GOOD + "inputs:\n  x: {shape: 3}\n", 3, "inputs.x.shape", "expected a list of dimensions"),
    (GOOD + "inputs:\n  x:\n    shape: [1, 0]\n", 4, "inputs.x.shape[1]", "positive integer, got 0"),
    (GOOD + "inputs:\n  x:\n    shape:\n      - 1\n      - -3\n", 6, "inputs.x.shape[1]", "got -3"),
    (GOOD + "inputs:\n  x: {shape: [1, N]}\n", 3, "inputs.x.shape[1]", "got a string 'N'"),
    (
        GOOD + "inputs:\n  x: {dtype: float}\n",
        3,
        "inputs.x.dtype",
        "unsupported dtype 'float' (did you mean 'float32'?)",
    ),
    (GOOD + "inputs:\n  x: {dtype: complex128}\n", 3, "inputs.x.dtype", "expected one of: float32,"),
    (GOOD + "tuning:\n  trials: -1\n", 3, "tuning.trials", "expected an integer >= 0"),
    (GOOD + "tuning:\n  trials: 2.5\n", 3, "tuning.trials", "expected an integer >= 0, got a number '2.5'"),
    (GOOD + "tuning:\n  trials: true\n", 3, "tuning.trials", "got a boolean"),
    (
        GOOD + "tuning:\n\n  deadline: 45 minutes\n",
        4,
        "tuning.deadline",
        "cannot parse duration '45 minutes'",
    ),
    (GOOD + "tuning:\n  deadline: 0s\n", 3, "tuning.deadline", "must be a positive duration"),
    (GOOD + "tuning:\n  deadline: [1]\n", 3, "tuning.deadline", "expected a duration"),
    (GOOD + "tuning:\n  records: 5\n", 3, "tuning.records", "expected a string"),
    (
        GOOD + "tuning:\n  tophub: /shared/hub\n",
        3,
        "tuning.tophub",
        "expected a list of paths or URLs, or 'none'",
    ),
    (GOOD + "tuning:\n  tophub: [a, 3]\n", 3, "tuning.tophub[1]", "expected a string"),
    (GOOD + "tuning:\n  transfer: no-thanks\n", 3, "tuning.transfer", "expected a boolean (true or false)"),
    (GOOD + "tuning:\n  transfr: false\n", 3, "tuning.transfr", "(did you mean 'transfer'?)"),
    (GOOD + "tuning: 5\n", 2, "tuning", "expected a mapping, got an integer"),
    (GOOD + "tuning:\n  cluster: head.lab\n", 3, "tuning.cluster", "expected HOST:PORT of a Ray head"),
    (GOOD + "requantize: exact\n", 2, "requantize", "expected one of float, fixed_point, got 'exact'"),
    (GOOD + "requantize: fixed_point\n", 2, "requantize", "applies to TFLite models; an ONNX model"),
    (GOOD + "target: gpu\n", 2, "target", "unknown kind 'gpu'"),
    (GOOD + "target: llvm -mcpu=native -num-cores=0\n", 2, "target", "-num-cores must be a positive integer"),
    (GOOD + "target: cuda -arch=80\n", 2, "target", "-arch must look like sm_80"),
    ("inputs: {}\n", 1, "model", "required key is missing"),
    ("# comment\n\nmodel:\n", 3, "model", "required key is missing"),
    ("model: models/missing.onnx\n", 1, "model", "model file not found: "),
    ("model: models/m.pb\n", 1, "model", "unsupported model format 'm.pb'"),
    ("model: [models/m.onnx]\n", 1, "model", "expected a string, got a list"),
    ("model: !!python/object/apply:os.system [ls]\n", 1, "model", "expected a string"),
    (GOOD + "validate: true\nvalidate: false\n", 3, "validate", "duplicate key 'validate' (first at line 2)"),
    (GOOD + "inputs:\n  x: {}\n  x: {}\n", 4, "inputs.x", "duplicate key 'inputs.x' (first at line 3)"),
    (GOOD + "? [a, b]\n: c\n", 2, "", "a key must be a plain name"),
]


@pytest.mark.parametrize(("text", "line", "key", "fragment"), ERRORS)
def test_errors_name_file_line_and_key(write, text, line, key, fragment):
    path = write(text)
    err = _error(path)
    message = str(err)
    assert message.startswith(f"{path}:{line}: "), message
    if key:
        assert f"'{key}'" in message or f": {key}: " in message, message
    assert fragment in message, message
    assert err.file == str(path) and err.line == line


def test_requantize_defaults_to_float_and_takes_fixed_point_for_tflite(write, tmp_path):
    assert load_recipe(write(GOOD)).requantize == "float"
    (tmp_path / "models" / "m.tflite").write_bytes(b"")
    recipe = load_recipe(write("model: models/m.tflite\nrequantize: fixed_point\n"))
    assert recipe.requantize == "fixed_point" and "requantize: fixed_point" in format_recipe(recipe)


def test_missing_model_names_the_resolved_path(write, tmp_path):
    message = str(_error(write("model: ../elsewhere/x.onnx\n")))
    assert str((tmp_path / ".." / "elsewhere" / "x.onnx").resolve()) in message


def test_target_error_carries_parse_target_message(write):
    err = _error(write(GOOD + "target: llvm -foo=1\n"))
    assert err.key == "target" and "unknown option -foo (allowed: mcpu, mattr, mtriple, num-cores)" in str(
        err
    )


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        (GOOD + "inputs:\n  x: {shape: [1, 2}\n", 3, "YAML syntax error"),
        (GOOD + "tuning:\n\ttrials: 3\n", 3, "found character '\\t'"),
        (GOOD + "a: b: c\n", 2, "mapping values are not allowed here"),
        (GOOD + "---\nmodel: x\n", 2, "expected a single document"),
    ],
)
def test_yaml_syntax_errors_have_a_line(write, text, line, fragment):
    path = write(text)
    message = str(_error(path))
    assert message.startswith(f"{path}:{line}: "), message
    assert fragment in message, message


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n", "~\n"])
def test_empty_recipe(write, text):
    path = write(text)
    assert str(_error(path)) == f"{path}:1: the recipe is empty (it needs at least 'model: <file>')"


@pytest.mark.parametrize(("text", "kind"), [("- a\n- b\n", "a list"), ("just text\n", "a string")])
def test_top_level_must_be_a_mapping(write, text, kind):
    path = write(text)
    message = str(_error(path))
    assert message.startswith(f"{path}:1: the top level must be a mapping of keys, got {kind}"), message


def test_unreadable_recipe_names_the_file(tmp_path):
    path = tmp_path / "nope.yaml"
    message = str(_error(path))
    assert message.startswith(f"{path}: cannot read recipe"), message


def test_example_recipes_load(tmp_path):
    """Every example recipe is valid; models other than the committed MLP are stood in for by empty files."""
    (tmp_path / "models").mkdir()
    for recipe in sorted(RECIPES.glob("*.yaml")):
        copy = tmp_path / recipe.name
        copy.write_text(recipe.read_text())
        r = yaml.safe_load(recipe.read_text())
        (tmp_path / r["model"]).write_bytes(b"")
        loaded = load_recipe(copy)
        assert loaded.output == (tmp_path.parent / "build" / f"{recipe.stem}.aotc").resolve()
        assert loaded.tuning.trials == 0 and loaded.validate
        assert all(spec.shape and spec.dtype == "float32" for spec in loaded.inputs.values())


def test_committed_mlp_recipe_loads_in_place():
    r = load_recipe(RECIPES / "mlp.yaml")
    assert r.model == RECIPES / "models" / "mlp.onnx"
    assert r.output == RECIPES.parent / "build" / "mlp.aotc"


def test_a_target_feature_the_runtime_cannot_check_is_a_recipe_error(write):
    with pytest.raises(RecipeError, match=r"target: .*\+egpr: a package cannot record this feature"):
        load_recipe(write("model: models/m.onnx\ntarget: llvm -mcpu=znver4 -mattr=+egpr\n"))
