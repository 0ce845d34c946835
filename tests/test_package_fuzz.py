"""Acceptance fuzz of the package checks: every mutation of a valid MLP package (manifest fields, member
bytes, zip structure) verified, described, loaded, run and profiled in a child process must end in a
clean PackageError, or run to outputs bit-for-bit equal to the unmutated package's. Never a signal,
never a wrong output, never another exception. A seeded few hundred cases run by default; all of them
(thousands) with `-m slow`."""

from __future__ import annotations

import copy
import hashlib
import io
import json
import warnings
import zipfile
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from aotc_runtime.elf import read_elf

from aotc.build import build
from aotc.recipe import load_recipe
from recipes.zoo import onnx_models as models
from tests.package_runner import PackageRunner

DELETE = object()
Case = tuple[str, Callable[[], bytes]]


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """(package bytes, its members by name, inputs .npz path, runner env, the outputs' fingerprint)."""
    return built_mlp(tmp_path_factory, "", batch=1)


@pytest.fixture(scope="module")
def mlp_variants(tmp_path_factory):
    """`mlp` compiled for batch sizes 1 and 2 in one package, run at 2 (its second variant)."""
    return built_mlp(tmp_path_factory, "inputs: {input: {shape: [[1, 2], 64]}}\n", batch=2)


def built_mlp(tmp_path_factory, inputs: str, batch: int):
    root = tmp_path_factory.mktemp("fuzz")
    models.save(models.mlp(), root / "mlp.onnx")
    (root / "mlp.yaml").write_text(f"model: mlp.onnx\noutput: mlp.aotc\n{inputs}")
    build(load_recipe(root / "mlp.yaml"), log=lambda _: None)
    package = (root / "mlp.aotc").read_bytes()
    with zipfile.ZipFile(io.BytesIO(package)) as zf:
        members = {i.filename: zf.read(i) for i in zf.infolist()}
    x = np.random.default_rng(0).standard_normal((batch, 64)).astype("float32")
    inputs = str(root / "inputs.npz")
    np.savez(inputs, input=x)
    cache = tmp_path_factory.mktemp("fuzz-cache")
    env = {"AOTC_RUNTIME_CACHE": str(cache)}
    with PackageRunner(env=env) as runner:
        path = root / "case.aotc"
        path.write_bytes(package)
        baseline = runner.attempt(str(path), inputs)
    assert baseline["status"] == "ok", baseline
    return package, members, inputs, env, baseline["outputs"]


# ----------------------------------------------------------------------------- building mutated packages


def zip_of(entries: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(buf, "w") as zf:
        warnings.simplefilter("ignore")  # duplicate names are one of the mutations
        for name, data in entries:
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_DEFLATED if name == "manifest.json" else zipfile.ZIP_STORED
            zf.writestr(info, data)
    return buf.getvalue()


def with_manifest(members: dict[str, bytes], manifest: object, replaced: dict | None = None) -> bytes:
    entries = {**members, **(replaced or {})}
    entries["manifest.json"] = manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode()
    return zip_of(list(entries.items()))


def rehashed(manifest: dict, name: str, data: bytes) -> dict:
    manifest = copy.deepcopy(manifest)
    manifest["members"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    return manifest


def field_paths(value: object, prefix: tuple = ()) -> Iterator[tuple]:
    """Every key path inside the manifest (dict keys and list indices), parents before children."""
    if prefix:
        yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from field_paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from field_paths(v, (*prefix, i))


def value_variants(value: object) -> list[tuple[str, object]]:
    """Replacements for one manifest value: deleted, of the wrong type, off by one, huge, renamed..."""
    out: list[tuple[str, object]] = [
        ("delete", DELETE),
        ("null", None),
        ("str", "x"),
        ("list", []),
        ("dict", {}),
        ("true", True),
        ("float", 1.5),
    ]
    if type(value) is int:
        out += [("+1", value + 1), ("-1", value - 1), ("0", 0), ("negative", -value - 1)]
        out += [("2**63", 1 << 63), ("1e30", 10**30), ("as float", float(value)), ("+64", value + 64)]
    elif isinstance(value, str):
        out += [("empty", ""), ("suffixed", value + "_"), ("abort", "abort"), ("free", "free")]
        out += [("float64", "float64"), ("int8", "int8"), ("object", "object"), ("../", "../" + value)]
        out += [("aotc_run", "aotc_run"), ("k0", "k0"), ("upper", value.upper())]
    elif isinstance(value, list):
        if value:
            out += [("append", [*value, value[-1]]), ("drop last", value[:-1]), ("reversed", value[::-1])]
            out += [("first twice", [value[0], *value])]
            if all(type(v) is int for v in value):
                out += [("dims+1", [v + 1 for v in value]), ("flat", [int(np.prod(value))])]
    elif isinstance(value, dict):
        out += [("extra key", {**value, "extra": 1})]
    return [(label, v) for label, v in out if v is DELETE or v != value or type(v) is not type(value)]


def mutated(manifest: dict, path: tuple, replacement: object) -> dict:
    m = copy.deepcopy(manifest)
    parent = m
    for key in path[:-1]:
        parent = parent[key]
    if replacement is DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = replacement
    return m


def manifest_cases(members: dict[str, bytes]) -> Iterator[Case]:
    manifest = json.loads(members["manifest.json"])
    for path in field_paths(manifest):
        parent = manifest
        for key in path[:-1]:
            parent = parent[key]
        for label, replacement in value_variants(parent[path[-1]]):
            name = "manifest " + ".".join(map(str, path)) + f" {label}"
            yield name, (lambda p=path, r=replacement: with_manifest(members, mutated(manifest, p, r)))


def json_cases(members: dict[str, bytes]) -> Iterator[Case]:
    """manifest.json bytes that are not the JSON object they should be."""
    raw = members["manifest.json"]
    text = raw.decode()
    yield (
        "json duplicate key",
        lambda: with_manifest(members, text.replace('"entry":', '"entry": "abort", "entry":', 1).encode()),
    )
    yield "json NaN workspace", lambda: with_manifest(members, re_sub_workspace(text, "NaN"))
    yield "json truncated", lambda: with_manifest(members, raw[: len(raw) // 2])
    yield "json not an object", lambda: with_manifest(members, b"[1, 2, 3]")
    yield "json deep nesting", lambda: with_manifest(members, b"[" * 100000 + b"]" * 100000)
    yield "json invalid utf-8", lambda: with_manifest(members, raw.replace(b'"name"', b'"n\xffme"', 1))
    yield "json empty", lambda: with_manifest(members, b"")


def re_sub_workspace(text: str, value: str) -> bytes:
    m = json.loads(text)
    m["memory_plan"]["workspace_bytes"] = 12345
    return json.dumps(m).replace("12345", value).encode()


def member_cases(members: dict[str, bytes], rng: np.random.Generator, flips: int) -> Iterator[Case]:
    """Member bytes changed: bit flips and truncations, with the manifest left as it was (checksums)
    or, where no code changes, updated to match (sizes, the plan section)."""
    manifest = json.loads(members["manifest.json"])
    for name in ("lib/model.so", "weights.bin"):
        data = members[name]
        for k in range(flips):
            at, bit = int(rng.integers(len(data))), int(rng.integers(8))
            flipped = bytearray(data)
            flipped[at] ^= 1 << bit
            yield (
                f"{name} flip {k} at {at}",
                lambda n=name, d=bytes(flipped): with_manifest(members, manifest, {n: d}),
            )
        for cut in (0, 1, len(data) // 2, len(data) - 1):
            short = data[:cut]
            yield f"{name} cut to {cut}", lambda n=name, d=short: with_manifest(members, manifest, {n: d})
            yield (
                f"{name} cut to {cut} rehashed",
                lambda n=name, d=short: with_manifest(members, rehashed(manifest, n, d), {n: d}),
            )
        longer = data + b"\0" * 64
        yield (
            f"{name} extended rehashed",
            lambda n=name, d=longer: with_manifest(members, rehashed(manifest, n, d), {n: d}),
        )
    lib = members["lib/model.so"]
    start = lib.index(read_elf(lib).section(".aotc_plan"))
    end = lib.index(b"\0", start)
    for k in range(flips):
        at, bit = int(rng.integers(start, end + 1)), int(rng.integers(8))
        flipped = bytearray(lib)
        flipped[at] ^= 1 << bit
        d = bytes(flipped)
        yield (
            f"plan section flip {k} at {at - start} rehashed",
            lambda d=d: with_manifest(members, rehashed(manifest, "lib/model.so", d), {"lib/model.so": d}),
        )


def zip_cases(
    package: bytes, members: dict[str, bytes], rng: np.random.Generator, flips: int
) -> Iterator[Case]:
    items = list(members.items())
    for cut in sorted({0, 4, 22, len(package) // 3, len(package) // 2, len(package) - 22, len(package) - 1}):
        yield f"zip cut to {cut}", lambda c=cut: package[:c]
    for _ in range(flips):
        at = int(rng.integers(len(package)))
        flipped = bytearray(package)
        flipped[at] ^= 0xFF
        yield f"zip byte {at} flipped", lambda d=bytes(flipped): d
    yield "zip weights twice", lambda: zip_of([*items, ("weights.bin", members["weights.bin"])])
    yield "zip manifest twice", lambda: zip_of([*items, ("manifest.json", members["manifest.json"])])
    for extra in (
        "payload.sh",
        "../evil.so",
        "/etc/evil",
        "lib/../lib/model.so",
        "lib\\model.so",
        "./weights.bin",
    ):
        yield f"zip extra member {extra}", lambda e=extra: zip_of([*items, (e, b"#!/bin/sh\n")])
    yield "zip without manifest", lambda: zip_of([kv for kv in items if kv[0] != "manifest.json"])
    yield "zip without library", lambda: zip_of([kv for kv in items if kv[0] != "lib/model.so"])
    yield "zip members reversed", lambda: zip_of(items[::-1])
    yield (
        "zip with a malformed signature.json",
        lambda: zip_of([*items, ("signature.json", b'{"not": "checked here"}')]),
    )
    listed = json.loads(members["manifest.json"])
    evil = rehashed(listed, "../evil.so", b"x")
    yield "zip listed ../ member", lambda: with_manifest({**members, "../evil.so": b"x"}, evil)
    signed = rehashed(listed, "signature.json", b"x")
    yield "zip lists signature.json", lambda: with_manifest({**members, "signature.json": b"x"}, signed)


def all_cases(package: bytes, members: dict[str, bytes], seed: int, flips: int) -> list[Case]:
    rng = np.random.default_rng(seed)
    return [
        *manifest_cases(members),
        *json_cases(members),
        *member_cases(members, rng, flips),
        *zip_cases(package, members, rng, flips),
    ]


# ----------------------------------------------------------------------------- running them


def run_cases(cases: list[Case], mlp, tmp_path) -> tuple[dict[str, dict], list[str]]:
    """Each case's report, and a line for every case that did not end as it must."""
    _, _, inputs, env, expected = mlp
    path = tmp_path / "case.aotc"
    reports, bad = {}, []
    with PackageRunner(env=env) as runner:
        for name, make in cases:
            path.write_bytes(make())
            report = runner.attempt(str(path), inputs)
            reports[name] = report
            if report["status"] == "PackageError":
                continue
            if report["status"] == "ok" and report["outputs"] == expected and report["profiled"] == expected:
                continue
            bad.append(f"{name}: {json.dumps(report)[:300]}")
    return reports, bad


def test_sampled_mutations_end_in_a_package_error_or_the_same_outputs(mlp, tmp_path):
    package, members, *_ = mlp
    cases = all_cases(package, members, seed=20, flips=8)
    structural = [c for c in cases if not c[0].startswith("manifest ")]
    fields = [c for c in cases if c[0].startswith("manifest ")]
    rng = np.random.default_rng(20)
    sample = [fields[i] for i in sorted(rng.choice(len(fields), size=min(600, len(fields)), replace=False))]
    reports, bad = run_cases(structural + sample, mlp, tmp_path)
    assert bad == []
    statuses = {r["status"] for r in reports.values()}
    assert statuses == {"ok", "PackageError"}  # some mutations are harmless (provenance, names of weights)
    assert reports["zip with a malformed signature.json"]["status"] == "PackageError"  # always refused
    assert reports["zip weights twice"]["status"] == "PackageError"


def test_sampled_mutations_of_a_package_of_two_batch_sizes(mlp_variants, tmp_path):
    """As above, on a package of two variants run at its second: its manifest's `variants` must equal
    the plan's, and each variant's calls stay inside its own buffers."""
    package, members, *_ = mlp_variants
    assert len(json.loads(members["manifest.json"])["variants"]) == 2
    cases = all_cases(package, members, seed=21, flips=8)
    structural = [c for c in cases if not c[0].startswith("manifest ")]
    fields = [c for c in cases if c[0].startswith("manifest variants.1")]
    rng = np.random.default_rng(21)
    chosen = set(rng.choice(len(fields), size=min(400, len(fields)), replace=False).tolist())
    must = ("manifest variants.1 delete", "manifest variants.1.workspace_bytes -1")
    sample = [c for i, c in enumerate(fields) if i in chosen or c[0] in must]
    reports, bad = run_cases(structural + sample, mlp_variants, tmp_path)
    assert bad == []
    assert reports["manifest variants.1 delete"]["status"] == "PackageError"
    assert reports["manifest variants.1.workspace_bytes -1"]["status"] == "PackageError"


@pytest.mark.slow
def test_every_mutation_ends_in_a_package_error_or_the_same_outputs(mlp, tmp_path):
    package, members, *_ = mlp
    reports, bad = run_cases(all_cases(package, members, seed=7, flips=500), mlp, tmp_path)
    assert bad == []
    assert len(reports) > 5000
