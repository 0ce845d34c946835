"""The shipped aotc/tophub/ records: readable, and on the CPU class they were tuned for, a full hit for every
recipe's example model (so `make demo` and the other recipes build tuned kernels without tuning)."""

import shutil
from pathlib import Path

import pytest
import yaml

from aotc.build import load_model, load_variants, variant_tasks
from aotc.graph.partition import extract_tasks, partition
from aotc.hub import open_sources
from aotc.hub.store import shipped_store_dir, store_files
from aotc.recipe import Recipe, load_recipe
from aotc.search.records import read_record_file
from aotc.target import parse_target
from recipes.zoo import onnx_models as models

ROOT = Path(__file__).parent.parent


def test_shipped_store_parses_without_corrupt_lines():
    files = store_files(ROOT / "aotc" / "tophub")
    assert files, "aotc/tophub/ ships no records"
    for path in files:
        content = read_record_file(path)
        assert content.records and not content.corrupt, path


def shipped_cpu_classes() -> str:
    """The -mcpu values of the shipped records (the key also needs their exact features and core count)."""
    cpus = {
        parse_target(r.target).mcpu
        for path in store_files(ROOT / "aotc" / "tophub")
        for r in read_record_file(path).records
    }
    return ", ".join(sorted(cpus))


RECIPES = sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml"))


@pytest.mark.parametrize("name", RECIPES)
def test_every_recipe_is_a_full_hit_on_the_shipped_cpu_class(name, tmp_path, monkeypatch):
    monkeypatch.delenv("AOTC_TOPHUB", raising=False)
    monkeypatch.delenv("AOTC_SHIPPED_TOPHUB", raising=False)
    assert shipped_store_dir() == ROOT / "aotc" / "tophub"
    path = ROOT / "recipes" / f"{name}.yaml"
    model = Path(yaml.safe_load(path.read_text())["model"])
    if not (path.parent / model).exists():  # the large example ONNX models come from recipes/make_models.py
        models.save(models.EXAMPLES[model.stem](), tmp_path / model)
        path = Path(shutil.copy(path, tmp_path))
    recipe = load_recipe(path)
    target = parse_target(recipe.target)
    sources = open_sources(None, None, user_store=tmp_path / "empty-user-store")
    if not sources.records_for(target):
        pytest.skip(
            f"aotc/tophub/ ships records for {shipped_cpu_classes()} only, this target is {target.mcpu}"
        )
    tasks = extract_tasks(partition(load_model(recipe)))
    looked = [sources.lookup(task.dag, target) for task in tasks]
    assert [x.status for x in looked] == ["hit"] * len(tasks), [str(x) for x in looked]
    assert all(x.source.startswith("tophub:") for x in looked)
    # structure keys let a model of the same layers with other constants take them as twins' records
    assert [x.record.structure for x in looked] == [task.dag.structure_key for task in tasks]


INT8_MOBILENET_V2_CPUS = ("znver3", "znver5")


def test_int8_mobilenet_v2_is_a_full_hit_where_its_records_ship(tmp_path, monkeypatch):
    """The int8 MobileNetV2 224 of the benchmarks (`benchmarks/e2e.py --tflite`, `tflite_models`) ships
    tuned for znver3 and znver5 only: a full hit there, with structure keys for other calibrations' twins."""
    from recipes.zoo import tflite_models

    monkeypatch.delenv("AOTC_TOPHUB", raising=False)
    monkeypatch.delenv("AOTC_SHIPPED_TOPHUB", raising=False)
    path = tmp_path / "mobilenet_v2_int8.tflite"
    path.write_bytes(tflite_models.int8_model(tflite_models.mobilenet_v2()).build())
    recipe = Recipe(model=path)
    target = parse_target(recipe.target)
    sources = open_sources(None, None, user_store=tmp_path / "empty-user-store")
    if target.mcpu not in INT8_MOBILENET_V2_CPUS or not sources.records_for(target):
        pytest.skip(
            f"its records ship for {', '.join(INT8_MOBILENET_V2_CPUS)} only, this target is {target.mcpu}"
        )
    tasks = variant_tasks(load_variants(recipe))
    looked = [sources.lookup(task.dag, target) for task in tasks]
    assert [x.status for x in looked] == ["hit"] * len(tasks), [str(x) for x in looked]
    assert [x.record.structure for x in looked] == [task.dag.structure_key for task in tasks]
