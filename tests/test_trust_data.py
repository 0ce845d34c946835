"""Records and bundles as a trust boundary, and builds that never destroy data (issue 20, items 5-7):
records validated on every way in, all-or-nothing imports, bounded bundles, pinned URLs, prune only
of stores, no output over an input, the report before the package swap, bounded CLI numbers, a memory
limit before any work, and measured records that survive a killed build."""

import argparse
import dataclasses
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time
import tracemalloc
import urllib.error
import warnings
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from aotc.build import BuildError, build
from aotc.cli import main, output_files
from aotc.hub import BundleError, HubError, open_sources, read_bundle
from aotc.hub import bundle as bundle_module
from aotc.hub.bundle import bundle_bytes, fetch_bundle
from aotc.hub.cli import add_hub_parser, cmd_hub
from aotc.hub.store import (
    TargetKey,
    append_to_store,
    merge_into_store,
    record_identity,
    store_files,
)
from aotc.recipe import RecipeError, load_recipe
from aotc.schedule.state import State
from aotc.search.common import MeasureResult
from aotc.search.records import Record, RecordWarning, append_records, load_records, read_record_file
from aotc.target import parse_target
from aotc.topi.workloads import make_workload
from recipes.zoo import onnx_models as models

SKX = parse_target("llvm -mcpu=skylake-avx512 -num-cores=4")
OPSET = [helper.make_operatorsetid("", 17)]
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def home(isolated_home):
    return isolated_home


def matmul():
    return make_workload("matmul", [16, 16, 16])


def genuine(cost=1e-5, factor=4) -> Record:
    dag = matmul()
    state = State.initial(dag).split(2, 0, [factor])
    return Record.from_result(dag, SKX, state, MeasureResult([cost, cost * 1.02, cost * 0.98]))


def line_with(rec: Record, **fields) -> str:
    obj = json.loads(rec.to_json())
    obj.update(fields)
    return json.dumps(obj)


def hub(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="aotc")
    add_hub_parser(parser.add_subparsers(dest="command"))
    return cmd_hub(parser.parse_args(["hub", *argv]))


def zip_bytes(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


# ----------------------------------------------------------------------------- record validation


@pytest.mark.parametrize(
    "costs, reason",
    [
        ([0.0], "below"),
        ([-1.0], "below"),
        ([float("nan")], "not finite"),
        ([float("inf")], "not finite"),
        ([1e9], "above"),
        ([], "without costs"),
        ([1e-12, 1e-5], "below"),
        (["1e-5"], "not a number"),
        ([True], "not a number"),
    ],
)
def test_record_with_impossible_costs_is_refused(costs, reason):
    with pytest.raises(ValueError, match=reason):
        Record.from_json(line_with(genuine(), costs=costs))


def test_record_faster_than_the_targets_peak_is_refused_by_its_flops_and_at_lookup(tmp_path, home):
    dag = matmul()
    fast = genuine(cost=1e-9 * 1.5, factor=8)  # 8192 FLOPs in 1.5 ns: 5.5 TFLOP/s, SKX-4 peaks at 6.1
    assert Record.from_json(fast.to_json())
    forged = genuine(cost=2e-9, factor=8)
    with pytest.raises(ValueError, match="ceiling"):
        Record.from_json(line_with(forged, flops=10**9))  # 1 GFLOP in 2 ns
    # a record without the flops field passes the store, and the DAG's FLOPs refuse it at lookup
    slow = genuine(cost=1e-5)
    one_core = parse_target("llvm -mcpu=skylake-avx512 -num-cores=1")
    quick = dataclasses.replace(
        genuine(cost=1e-9 * 1.1, factor=2),
        flops=None,
        target=str(one_core),
        hw=dict(num_cores=1, vector_bytes=64),
    )
    append_to_store(home / "tophub", [dataclasses.replace(slow, target=str(one_core)), quick])
    sources = open_sources(None, None)
    with pytest.warns(Warning, match="ceiling"):
        found = sources.lookup(dag, one_core)
    assert found.status == "hit" and found.record.mean_cost == pytest.approx(1e-5)


def test_poisoned_store_line_never_wins_verify_names_it_and_prune_drops_it(home, capsys):
    good = genuine(1e-5)
    append_to_store(home / "tophub", [good])
    file = store_files(home / "tophub")[0]
    with open(file, "a") as f:
        f.write(line_with(genuine(1e-5, factor=2), costs=[-1.0]) + "\n")
        f.write(line_with(genuine(1e-5, factor=8), costs=[0.0]) + "\n")
        f.write(line_with(genuine(1e-5, factor=16), costs=[float("nan")]) + "\n")
    with pytest.warns(Warning, match="corrupt"):
        found = open_sources(None, None).lookup(matmul(), SKX)
    assert found.status == "hit" and found.record.steps == good.steps
    assert hub("verify") == 1
    out = capsys.readouterr().out
    for lineno in (2, 3, 4):
        assert f"{file}:{lineno}: " in out
    assert "below" in out and "not finite" in out
    assert hub("prune") == 0
    kept = read_record_file(file)
    assert [r.steps for r in kept.records] == [good.steps] and not kept.corrupt


def test_load_records_skips_invalid_lines(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text(genuine().to_json() + "\n" + line_with(genuine(), costs=[0.0]) + "\n")
    with pytest.warns(RecordWarning, match="line 2"):
        assert len(load_records(path)) == 1


def test_invalid_records_are_never_written(tmp_path, home):
    bad = dataclasses.replace(genuine(factor=8), costs=[float("nan")])
    with pytest.warns(RecordWarning, match="not writing an invalid record"):
        append_records(tmp_path / "log.jsonl", [genuine(), bad])
    assert len((tmp_path / "log.jsonl").read_text().splitlines()) == 1
    with pytest.warns(RecordWarning, match="not writing"):
        append_to_store(home / "tophub", [bad])
    assert not any(p.read_text() for p in store_files(home / "tophub"))


# ----------------------------------------------------------------------------- import


def test_bundle_with_a_nan_cost_is_refused_whole_and_the_store_is_unchanged(tmp_path, home, capsys):
    recs = [genuine(1e-5, f) for f in (2, 4, 8, 16)]
    data, manifest = bundle_bytes(recs[:1], TargetKey.of(SKX))
    body = "".join(
        line_with(r, costs=[float("nan")]) + "\n" if i == 3 else r.to_json() + "\n"
        for i, r in enumerate(recs)
    ).encode()
    manifest["members"]["records.jsonl"] = {
        "sha256": hashlib.sha256(body).hexdigest(),
        "bytes": len(body),
        "lines": 4,
    }
    bad = tmp_path / "bad.tophub"
    bad.write_bytes(zip_bytes({"manifest.json": json.dumps(manifest).encode(), "records.jsonl": body}))
    assert hub("verify", str(bad)) == 1
    assert "records.jsonl line 4: not a valid record (cost nan is not finite)" in capsys.readouterr().err
    assert hub("import", str(bad)) == 1
    assert not store_files(home / "tophub")


def test_merge_is_all_or_nothing(home):
    append_to_store(home / "tophub", [genuine(2e-5)])
    before = {p: p.read_bytes() for p in store_files(home / "tophub")}
    poisoned = dataclasses.replace(genuine(1e-5, factor=8), costs=[-1.0])
    with pytest.raises(HubError, match="record 2 .* invalid"):
        merge_into_store(home / "tophub", [genuine(1e-5, factor=2), poisoned])
    assert {p: p.read_bytes() for p in store_files(home / "tophub")} == before


def test_zip_bomb_is_refused_before_it_is_decompressed(tmp_path):
    data, manifest = bundle_bytes([genuine()], TargetKey.of(SKX))
    members = {n: zipfile.ZipFile(io.BytesIO(data)).read(n) for n in ("manifest.json", "records.jsonl")}
    bomb = tmp_path / "bomb.tophub"
    bomb.write_bytes(zip_bytes(members | {"records.jsonl": b"\n" * (20 << 20)}))
    assert bomb.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(BundleError, match="zip bomb|more than a bundle may hold"):
            read_bundle(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20
    many = tmp_path / "many.tophub"
    many.write_bytes(zip_bytes(members | {f"x{i}": b"" for i in range(100)}))
    with pytest.raises(BundleError, match="102 members"):
        read_bundle(many)


def test_pinned_url_is_never_served_by_an_unpinned_copy(tmp_path, home, monkeypatch):
    data, _ = bundle_bytes([genuine()], TargetKey.of(SKX))
    url = "https://example.invalid/team.tophub"
    monkeypatch.setattr(bundle_module.urllib.request, "urlopen", lambda *a, **k: io.BytesIO(data))
    assert fetch_bundle(url).read_bytes() == data  # an unpinned copy is cached

    def offline(*args, **kwargs):
        raise urllib.error.URLError("server down")

    monkeypatch.setattr(bundle_module.urllib.request, "urlopen", offline)
    other = hashlib.sha256(b"another bundle").hexdigest()
    with pytest.raises(HubError, match="cannot download"):
        fetch_bundle(f"{url}#sha256={other}")
    with pytest.warns(Warning, match="using the copy"):
        assert fetch_bundle(url).read_bytes() == data
    pin = hashlib.sha256(data).hexdigest()
    with pytest.raises(HubError, match="cannot download"):
        fetch_bundle(f"{url}#sha256={pin}")  # the right bytes, but never verified against this pin


# ----------------------------------------------------------------------------- prune


def test_prune_refuses_a_directory_that_is_not_a_store(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    train = data / "train.jsonl"
    train.write_text('{"text": "a training example"}\n' * 3)
    before = train.read_bytes()
    assert hub("prune", str(data)) == 1
    assert "not a tophub store" in capsys.readouterr().err
    assert train.read_bytes() == before
    assert hub("verify", str(data)) == 1


# ----------------------------------------------------------------------------- build and CLI


@pytest.fixture
def mlp(tmp_path):
    models.save(models.mlp(), tmp_path / "mlp.onnx")
    return tmp_path / "mlp.onnx"


@pytest.mark.parametrize(
    "output", ["mlp.onnx", "./sub/../mlp.onnx", "link.onnx", "recipe.yaml", "records.jsonl"]
)
def test_output_over_an_input_file_is_refused(tmp_path, mlp, output):
    (tmp_path / "link.onnx").symlink_to(mlp)
    (tmp_path / "sub").mkdir()
    (tmp_path / "records.jsonl").write_text("")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"model: mlp.onnx\noutput: {output}\ntuning:\n  records: records.jsonl\n")
    before = mlp.read_bytes()
    with pytest.raises(RecipeError, match="output: .*overwrite|output: .*also"):
        load_recipe(recipe)
    assert main(["build", str(recipe)]) == 2
    assert mlp.read_bytes() == before


def test_records_over_the_model_is_refused(tmp_path, mlp):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model: mlp.onnx\ntuning:\n  records: mlp.onnx\n")
    with pytest.raises(RecipeError, match="tuning.records: .*also model"):
        load_recipe(recipe)


def test_a_report_that_cannot_be_written_leaves_the_old_package(tmp_path, mlp, monkeypatch):
    recipe = tmp_path / "mlp.yaml"
    recipe.write_text("model: mlp.onnx\noutput: out/mlp.aotc\nvalidate: false\n")
    package = tmp_path / "out" / "mlp.aotc"
    package.parent.mkdir()
    package.write_bytes(b"the previous package")

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("aotc.build.write_report", disk_full)
    assert main(["build", str(recipe)]) == 1
    assert package.read_bytes() == b"the previous package"
    assert [p.name for p in package.parent.iterdir()] == ["mlp.aotc"]


@pytest.mark.parametrize(
    "argv",
    [
        ["build", "R", "--deadline", "inf"],
        ["build", "R", "--deadline", "nan"],
        ["build", "R", "--deadline", "-5m"],
        ["build", "R", "--deadline", "400d"],
        ["build", "R", "--trials", "-1"],
        ["build", "R", "--trials", "10000000000"],
        ["build", "R", "--memory-limit", "0"],
        ["run", "P", "--threads", "0"],
        ["run", "P", "--threads", "-2"],
        ["profile", "P", "--repeat", "0"],
        ["profile", "P", "--seed", "-1"],
        ["tune-op", "matmul", "--trials", "0"],
        ["validate", "P", "--model", "m.onnx", "--rtol", "nan"],
        ["hub", "prune", "--keep", "0"],
    ],
)
def test_cli_numbers_are_refused_before_any_work(tmp_path, mlp, monkeypatch, argv):
    recipe = tmp_path / "mlp.yaml"
    recipe.write_text("model: mlp.onnx\n")
    called = []
    monkeypatch.setattr("aotc.build.build", lambda *a, **k: called.append(a))
    argv = [str(recipe) if a == "R" else str(tmp_path / "x.aotc") if a == "P" else a for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2 and not called


class _FakeModel:
    num_threads = 1
    inputs: list = []

    def run(self, inputs):
        return {"../escape": np.ones(2), "/tmp/abs": np.zeros(2), "a/b": np.ones(1), "a_b": np.ones(3)}


def test_run_output_files_stay_inside_the_directory(tmp_path, monkeypatch, capsys):
    import aotc_runtime

    monkeypatch.setattr(aotc_runtime, "load", lambda *a, **k: _FakeModel())
    out = tmp_path / "deep" / "out"
    assert main(["run", str(tmp_path / "x.aotc"), "--output", str(out)]) == 0
    written = sorted(p.name for p in out.iterdir())
    assert len(written) == 4 and all((out / name).resolve().parent == out.resolve() for name in written)
    assert not (tmp_path / "deep" / "escape.npy").exists()
    assert "written as" in capsys.readouterr().out
    assert output_files(["..", ".", "", "y"]) == {"..": "_.npy", ".": "__2.npy", "": "__3.npy", "y": "y.npy"}
    # a plain name keeps its file even when a renamed one comes first and would take it
    assert output_files(["a/b", "a_b"]) == {"a/b": "a_b_2.npy", "a_b": "a_b.npy"}


def test_run_output_replaces_a_planted_symlink_instead_of_following_it(tmp_path, monkeypatch):
    import aotc_runtime

    monkeypatch.setattr(aotc_runtime, "load", lambda *a, **k: _FakeModel())
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious")
    for name in output_files([n for n in _FakeModel().run({})]).values():
        (out / name).symlink_to(victim)
    assert main(["run", str(tmp_path / "x.aotc"), "--output", str(out)]) == 0
    assert victim.read_text() == "precious" and not any(p.is_symlink() for p in out.iterdir())


def test_absurd_shapes_are_refused_before_compiling_naming_the_size(tmp_path, monkeypatch):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 100000, 100000])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 100000, 100000])
    nodes = [helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Softmax", ["t"], ["y"], axis=1)]
    model = helper.make_model(helper.make_graph(nodes, "huge", [x], [y]), opset_imports=OPSET)
    onnx.save(model, tmp_path / "huge.onnx")
    recipe = tmp_path / "huge.yaml"
    recipe.write_text("model: huge.onnx\nvalidate: false\n")
    monkeypatch.setattr("aotc.execution_plan.physical_memory", lambda: 64 << 30)
    monkeypatch.setattr("aotc.build.lookup_kernels", lambda *a: pytest.fail("looked kernels up"))
    with pytest.raises(BuildError, match=r"needs \d+\.\d GB .*physical memory \(68.7 GB\).*memory_limit"):
        build(load_recipe(recipe), log=lambda _: None)
    recipe.write_text("model: huge.onnx\nvalidate: false\nmemory_limit: 1TB\n")
    monkeypatch.setattr("aotc.build.lookup_kernels", lambda *a: (_ for _ in ()).throw(RuntimeError("past")))
    with pytest.raises(RuntimeError, match="past"):  # the limit raised: the build goes on
        build(load_recipe(recipe), log=lambda _: None)


def test_zero_size_dimension_is_a_fixed_extent_not_a_dynamic_one(tmp_path):
    """A dim_value of 0 is a zero-size dimension (the input has no elements), not an unknown one."""
    from aotc.frontend.onnx import load_onnx

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 0, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 0, 4])
    model = helper.make_model(
        helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "z", [x], [y]), opset_imports=OPSET
    )
    onnx.save(model, tmp_path / "z.onnx")
    graph = load_onnx(str(tmp_path / "z.onnx"))
    assert [str(v.type) for v in graph.inputs + graph.outputs] == ["float32[1, 0, 4]"] * 2


# ----------------------------------------------------------------------------- a killed build

_TUNE_SCRIPT = """
import sys
from aotc.api import with_overrides
from aotc.build import build
from aotc.recipe import load_recipe
from aotc.search.measure import MeasureOptions
from aotc.search.params import SearchParams
fast = dict(measure=MeasureOptions(repeat=1, min_repeat_ms=1, n_build_workers=1), search=SearchParams(population=16, per_round=4))
build(with_overrides(load_recipe(sys.argv[1]), **fast), log=lambda _: None)
"""


def test_records_measured_before_a_kill_reach_the_user_store_on_resume(tmp_path, mlp, home):
    from aotc.api import with_overrides
    from aotc.search.measure import MeasureOptions
    from aotc.search.params import SearchParams

    recipe = tmp_path / "mlp.yaml"
    recipe.write_text("model: mlp.onnx\noutput: build/mlp.aotc\nvalidate: false\ntuning:\n  trials: 2000\n")
    log = tmp_path / "build" / "mlp.records.jsonl"
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _TUNE_SCRIPT, str(recipe)], env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if log.exists() and log.read_text().count("\n") >= 6:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the tuning build ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    measured = load_records(log)
    assert len(measured) >= 6
    assert not store_files(home / "tophub")  # the kill came before the build saved anything

    done = len(measured)
    recipe.write_text(
        f"model: mlp.onnx\noutput: build/mlp.aotc\nvalidate: false\ntuning:\n  trials: {done + 2}\n"
    )
    fast = dict(
        measure=MeasureOptions(repeat=1, min_repeat_ms=1, n_build_workers=1),
        search=SearchParams(population=16, per_round=2),
    )
    build(with_overrides(load_recipe(recipe), **fast), log=lambda _: None, resume=True)
    stored = {record_identity(r) for p in store_files(home / "tophub") for r in read_record_file(p).records}
    assert {record_identity(r) for r in measured if r.ok} <= stored


def test_warnings_module_is_quiet_for_genuine_records(home):
    append_to_store(home / "tophub", [genuine()])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert open_sources(None, None).lookup(matmul(), SKX).status == "hit"


def test_a_pinned_file_url_must_match_its_pin(tmp_path):
    path = tmp_path / "b.tophub"
    path.write_bytes(bundle_bytes([genuine()], TargetKey.of(SKX))[0])
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert fetch_bundle(f"file://{path}#sha256={digest}") == path
    with pytest.raises(BundleError, match="pinned"):
        fetch_bundle(f"file://{path}#sha256={'0' * 64}")


def test_a_build_never_writes_into_a_record_store(tmp_path, mlp, home):
    store = home / "tophub"
    store.mkdir(parents=True)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"model: mlp.onnx\noutput: {store / 'llvm-znver4-0123456789ab.jsonl'}\nvalidate: false\n"
    )
    with pytest.raises(BuildError, match="inside the user record store"):
        build(load_recipe(recipe), log=lambda _: None)
    assert list(store.iterdir()) == []


def test_an_output_that_is_a_directory_is_refused_before_work(tmp_path, mlp):
    (tmp_path / "models").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: mlp.onnx\noutput: models\nvalidate: false\n")
    with pytest.raises(BuildError, match="is a directory"):
        build(load_recipe(recipe), log=lambda _: None)
    assert not (tmp_path / "models.report").exists()


def test_run_never_prints_an_output_name_raw_to_the_terminal(tmp_path, monkeypatch, capsys):
    import aotc_runtime

    class Model(_FakeModel):
        def run(self, inputs):
            return {"\x1b[31mred": np.ones(1)}

    monkeypatch.setattr(aotc_runtime, "load", lambda *a, **k: Model())
    assert main(["run", str(tmp_path / "x.aotc")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\x1b[31mred" in out


def test_inspect_escapes_control_characters_of_the_manifest(monkeypatch, capsys, tmp_path):
    import aotc.package

    monkeypatch.setattr("aotc.cli.package_summary", lambda *a: {"signature": None})
    monkeypatch.setattr(
        aotc.package, "describe_package", lambda *a, **k: "name          \x1b]0;pwned\x07evil\nok"
    )
    assert main(["inspect", str(tmp_path / "x.aotc")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\\x1b]0;pwned\\x07evil\nok" in out
