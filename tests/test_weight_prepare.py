"""Compact packages (`weights: compact`): Winograd weights stored as their 3x3 source and computed when the
package loads by kernels compiled into it, against the build's own float64 transform and against a
prepacked package of the same model."""

from __future__ import annotations

import json
import zipfile

import aotc_runtime
import numpy as np
import pytest
from aotc_runtime.plan import PlanError, encode_plan, parse_plan

from aotc.codegen.module import build_module, load_library
from aotc.graph.ir import Derivation
from aotc.schedule.layout import WeightLayout
from aotc.target import host_target
from aotc.weight_prepare import derived_value, prepare_kernel
from recipes.zoo import onnx_models

# float32 sums of at most 9 products of |G| <= 1 against the float64 transform
RTOL = 1e-6


@pytest.mark.parametrize(
    "tile, layout",
    [
        (4, None),
        (2, None),
        # tiles that overshoot C (20 = 2 x 16 > 18) and K: the padding must be zeros
        (
            4,
            WeightLayout(
                1, (6, 6, 18, 24), ((2, 16, 2), (0, 1, 6), (3, 8, 3), (1, 1, 6), (2, 1, 16), (3, 1, 8))
            ),
        ),
    ],
)
def test_prepare_kernel_computes_what_the_build_does(tmp_path, tile, layout):
    k, c = (24, 18) if layout is not None else (8, 5)
    source = np.random.default_rng(tile).standard_normal((k, c, 3, 3)).astype(np.float32)
    derivation = Derivation("winograd", source, tile)
    func = prepare_kernel(derivation, layout, "prepare_test", host_target())
    lib = load_library(build_module([func], host_target(), str(tmp_path / "p.so")))
    want = derived_value(derivation, layout)
    got = np.full(want.shape, np.nan, np.float32)
    lib.kernel("prepare_test")(source, got)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * np.abs(want).max())
    if layout is not None:
        assert (want == 0).any() and (got[want == 0] == 0).all()


@pytest.mark.parametrize("tile, largest", [(2, 9), (4, 49)])
def test_prepare_kernel_computes_the_integer_transform_exactly(tmp_path, tile, largest):
    """int8 weights (an int8 conv's integer Winograd): the int16 weights (DG) g (DG)^T, laid out by tiles
    that overshoot C and K, bit for bit."""
    source = np.random.default_rng(7).integers(-128, 128, (24, 18, 3, 3)).astype(np.int8)
    source[0, 0] = -128  # the largest magnitude, (sum of a row of |DG|)^2 * 128
    a = tile + 2
    layout = WeightLayout(
        1, (a, a, 18, 24), ((2, 16, 2), (0, 1, a), (3, 8, 3), (1, 1, a), (2, 1, 16), (3, 1, 8))
    )
    derivation = Derivation("winograd", source, tile)
    func = prepare_kernel(derivation, layout, "prepare_int", host_target())
    lib = load_library(build_module([func], host_target(), str(tmp_path / "p.so")))
    want = derived_value(derivation, layout)
    assert want.dtype == np.int16 and np.abs(want).max() == largest * 128
    got = np.full(want.shape, -1, np.int16)
    lib.kernel("prepare_int")(source, got)
    np.testing.assert_array_equal(got, want)


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """A narrow ResNet-18 (Winograd in every stage) built compact and prepacked: (model, compact, prepacked)."""
    import aotc

    root = tmp_path_factory.mktemp("compact")
    model = onnx_models.save(onnx_models.resnet18(size=32, width=16, classes=10), root / "r18.onnx")
    compact = aotc.compile(model, output=root / "compact.aotc")
    prepacked = aotc.compile(model, output=root / "prepacked.aotc", weights="prepacked")
    return model, compact, prepacked


def members(path) -> tuple[dict, dict, int]:
    with zipfile.ZipFile(path) as zf:
        manifest = json.loads(zf.read("manifest.json"))
        return manifest, manifest["weights"], zf.getinfo("weights.bin").file_size


def test_compact_package_stores_winograd_weights_as_their_source(both):
    _, compact, prepacked = both
    assert compact.result.validation and all(r["ok"] for r in compact.result.validation)
    manifest, weights, stored = members(compact.path)
    derived = [t for t in weights["tensors"] if "derived" in t]
    assert derived and all(t["derived"]["kind"] == "winograd" for t in derived)
    sources = {t["name"]: t for t in weights["tensors"]}
    for t in derived:  # each source is 3x3 weights, 1/4 of the transformed bytes for F(4, 3)
        source = sources[t["derived"]["from"]]
        assert source["shape"][2:] == [3, 3] and 4 * source["nbytes"] <= t["nbytes"]
    assert stored == weights["stored_nbytes"] < weights["nbytes"]
    _, plain, plain_stored = members(prepacked.path)
    assert "stored_nbytes" not in plain and plain_stored == plain["nbytes"]
    saved = sum(t["nbytes"] for t in derived) - sum(sources[t["derived"]["from"]]["nbytes"] for t in derived)
    assert plain_stored - stored >= 0.9 * saved
    assert any(k["symbol"].startswith("prepare_weight") for k in manifest["kernels"])


def test_compact_and_prepacked_packages_compute_the_same(both):
    _, compact, prepacked = both
    x = np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)
    a = aotc_runtime.load(str(compact.path)).run({"input": x})["output"]
    b = aotc_runtime.load(str(prepacked.path)).run({"input": x})["output"]
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * np.abs(b).max())


def test_plan_refuses_load_time_calls_outside_the_weights(both):
    """The load-time calls are checked as every call is: weights only, inside the weights buffer."""
    _, compact, _ = both
    plan = aotc_runtime.verify_package(str(compact.path)).plan
    document = plan.document
    assert plan.prepare is not None and plan.weights_stored_nbytes == document["weights_stored_nbytes"]

    def refused(change) -> str:
        doc = json.loads(json.dumps(document))
        change(doc)
        with pytest.raises(PlanError) as err:
            parse_plan(encode_plan(doc))
        return str(err.value)

    def to_input(doc):
        doc["prepare_plan"][0]["args"][1].update(kind="input", offset=0)

    def past_the_end(doc):
        doc["prepare_plan"][0]["args"][1]["offset"] = doc["weights_nbytes"]

    def stored_too_big(doc):
        doc["weights_stored_nbytes"] = doc["weights_nbytes"] + 64

    assert "refers to input 0 of 0" in refused(to_input)
    assert "covers bytes" in refused(past_the_end)
    assert "exceeds weights_nbytes" in refused(stored_too_big)
    assert "fields" in refused(lambda doc: doc.pop("prepare_plan"))


def test_inspect_shows_what_is_computed_at_load_and_what_loading_costs(both, capsys):
    from aotc.cli import main

    _, compact, _ = both
    assert main(["inspect", str(compact.path), "--load"]) == 0
    out = capsys.readouterr().out
    weights = next(line for line in out.splitlines() if line.startswith("weights"))
    assert "stored" in weights and "computed at load" in weights
    load = next(line for line in out.splitlines() if line.startswith("load"))
    assert " ms; resident memory +" in load
    assert main(["inspect", str(compact.path), "--load", "--json"]) == 0
    footprint = json.loads(capsys.readouterr().out)["footprint"]
    assert footprint["load_ms"] > 0 and footprint["rss_run_mb"] >= footprint["rss_load_mb"] >= 0
