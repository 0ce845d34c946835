"""The shipped tophub/ records: readable, and on the CPU class they were tuned for, a full hit for the
demo recipe (so `make demo` builds tuned kernels without tuning)."""

from pathlib import Path

import pytest

from aotc.build import load_model
from aotc.graph.partition import extract_tasks, partition
from aotc.hub import open_sources
from aotc.hub.store import read_store_file, shipped_store_dir, store_files
from aotc.recipe import load_recipe
from aotc.target import parse_target

ROOT = Path(__file__).parent.parent


def test_shipped_store_parses_without_corrupt_lines():
    files = store_files(ROOT / "tophub")
    assert files, "tophub/ ships no records"
    for path in files:
        content = read_store_file(path)
        assert content.records and not content.corrupt, path


def test_demo_recipe_is_a_full_hit_on_the_shipped_cpu_class(tmp_path, monkeypatch):
    monkeypatch.delenv("AOTC_TOPHUB", raising=False)
    assert shipped_store_dir() == ROOT / "tophub"
    recipe = load_recipe(ROOT / "recipes" / "mlp.yaml")
    target = parse_target(recipe.target)
    sources = open_sources(None, None, user_store=tmp_path / "empty-user-store")
    if not sources.records_for(target):
        pytest.skip(f"the shipped records are for another CPU class than {target.mcpu}")
    tasks = extract_tasks(partition(load_model(recipe)))
    looked = [sources.lookup(task.dag, target) for task in tasks]
    assert [x.status for x in looked] == ["hit"] * len(tasks), [str(x) for x in looked]
    assert all(x.source.startswith("tophub:") for x in looked)
