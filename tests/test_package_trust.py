"""A package is checked completely before its code runs: the manifest must match the plan the kernel
library carries in its `.aotc_plan` section, that plan must be self-consistent, and the library's own
defined symbols are the only ones called. Hostile packages run in a child process (tests.package_runner)."""

from __future__ import annotations

import hashlib
import json
import re
import struct
import zipfile

import aotc_runtime
import aotc_runtime.package as rtpackage
import numpy as np
import pytest
from aotc_runtime import PackageError
from aotc_runtime.elf import ElfError, read_elf
from aotc_runtime.plan import PlanError, encode_plan, parse_plan

from aotc import te
from aotc.codegen.entry import build_entry_ir
from aotc.codegen.llvm import compile_to_object
from aotc.package import (
    BufferRef,
    IOSpec,
    KernelCall,
    VariantSpec,
    describe_package,
    plan_document,
    weight_refs,
    write_package,
)
from aotc.target import parse_target
from tests.package_runner import PackageRunner, fingerprint
from tests.test_package import SHAPE, elementwise_kernel, tiny_spec, tiny_weights

HALF = (2, SHAPE[1])  # the second variant of `variants_spec`: half the batch


def variants_spec():
    """`tiny_spec` compiled for x[4, 8] and x[2, 8]: the second variant adds x to the first two rows of w
    with kernels of its own, in a workspace of its own (64 bytes)."""
    spec = tiny_spec("tiny2")
    w = weight_refs(tiny_weights())["w"]
    half = 2 * SHAPE[1] * 4
    scratch = BufferRef("workspace", offset=0, nbytes=half)
    spec.kernels += [
        elementwise_kernel("k_add_half", lambda a, b: a + b, 2, shape=HALF),
        elementwise_kernel("k_relu_half", lambda a: te.maximum(a, 0.0), 1, shape=HALF),
    ]
    spec.kernel_info += [{"task": "add half"}, {"task": "relu half"}]
    spec.other_variants = [
        VariantSpec(
            inputs=[IOSpec("x", HALF, "float32")],
            outputs=[IOSpec("y", HALF, "float32")],
            calls=[
                KernelCall(
                    "k_add_half",
                    (BufferRef("input", 0), BufferRef("weight", offset=w.offset, nbytes=half), scratch),
                ),
                KernelCall("k_relu_half", (scratch, BufferRef("output", 0))),
            ],
            workspace_bytes=half,
        )
    ]
    return spec


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("runtime-cache"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AOTC_RUNTIME_CACHE", cache)
        yield {"AOTC_RUNTIME_CACHE": cache}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, cache_env):
    """(package path, inputs .npz path, the fingerprint of its outputs)."""
    root = tmp_path_factory.mktemp("trust")
    path = str(root / "tiny.aotc")
    write_package(tiny_spec(), path)
    x = np.random.default_rng(1).standard_normal(SHAPE).astype("float32")
    inputs = str(root / "inputs.npz")
    np.savez(inputs, x=x)
    return path, inputs, fingerprint(aotc_runtime.load(path).run({"x": x}))


@pytest.fixture(scope="module")
def tiny2(tmp_path_factory, cache_env):
    """`tiny` for two input shapes: (package path, inputs .npz path of the second shape, its fingerprint)."""
    root = tmp_path_factory.mktemp("trust2")
    path = str(root / "tiny2.aotc")
    write_package(variants_spec(), path)
    x = np.random.default_rng(2).standard_normal(HALF).astype("float32")
    inputs = str(root / "inputs.npz")
    np.savez(inputs, x=x)
    return path, inputs, fingerprint(aotc_runtime.load(path).run({"x": x}))


@pytest.fixture(scope="module")
def runner(cache_env):
    with PackageRunner(env=cache_env) as r:
        yield r


def rezip(src: str, dst: str, edit=None, members: dict | None = None, extra=(), rehash: bool = False) -> str:
    """Copy package `src` to `dst` with `edit(manifest)` applied to its manifest, member bytes replaced
    by `members` (their manifest sha256/size updated when `rehash`) and `extra` (name, bytes) appended."""
    members = members or {}
    with zipfile.ZipFile(src) as zin:
        manifest = json.loads(zin.read("manifest.json"))
        data = {i.filename: members.get(i.filename, zin.read(i)) for i in zin.infolist()}
    if rehash:
        for name in members:
            manifest["members"][name] = {
                "sha256": hashlib.sha256(members[name]).hexdigest(),
                "size": len(members[name]),
            }
    if edit is not None:
        edit(manifest)
    data["manifest.json"] = json.dumps(manifest, indent=2).encode()
    with zipfile.ZipFile(dst, "w") as zout:
        for name, blob in list(data.items()) + list(extra):
            zout.writestr(name, blob)
    return dst


def setter(*path_and_value):
    *keys, value = path_and_value

    def edit(m: dict) -> None:
        for k in keys[:-1]:
            m = m[k]
        m[keys[-1]] = value

    return edit


# ----------------------------------------------------------------------------- the tester's cases


TESTER_CASES = {
    "output shape": (
        setter("outputs", 0, "shape", [1, 1]),
        r"manifest.json outputs\[0\].shape is \[1, 1\] but the kernel library was compiled for \[4, 8\]",
    ),
    "workspace 0": (
        setter("memory_plan", "workspace_bytes", 0),
        r"manifest.json memory_plan.workspace_bytes is 0 but the kernel library was compiled for 192",
    ),
    "input shape": (setter("inputs", 0, "shape", [4, 9]), r"manifest.json inputs\[0\].shape is \[4, 9\]"),
    "input dtype": (
        setter("inputs", 0, "dtype", "float64"),
        r"manifest.json inputs\[0\].dtype is \"float64\"",
    ),
    "plan offset": (
        setter("execution_plan", 1, "args", 0, "offset", 1 << 40),
        r"manifest.json execution_plan\[1\].args\[0\].offset is 1099511627776 but the kernel library was compiled for 64",
    ),
    "entry abort": (
        setter("entry", "abort"),
        r"manifest.json entry is \"abort\" but the kernel library was compiled for \"aotc_run\"",
    ),
    "weights nbytes": (setter("weights", "nbytes", 1 << 20), r"manifest.json weights.nbytes is 1048576 but"),
    "kernel renamed": (
        setter("execution_plan", 0, "kernel", "free"),
        r"execution_plan\[0\].kernel is \"free\"",
    ),
}


VARIANT_CASES = {
    "second variant's call out of its workspace": (
        setter("variants", 1, "execution_plan", 0, "args", 2, "offset", 64),
        r"manifest.json variants\[1\].execution_plan\[0\].args\[2\].offset is 64 but the kernel library "
        "was compiled for 0",
    ),
    "second variant's input shape": (
        setter("variants", 1, "inputs", 0, "shape", [4, 8]),
        r"manifest.json variants\[1\].inputs\[0\].shape is \[4, 8\] but the kernel library was compiled for \[2, 8\]",
    ),
    "second variant's workspace": (
        setter("variants", 1, "workspace_bytes", 0),
        r"manifest.json variants\[1\].workspace_bytes is 0",
    ),
    "second variant's entry": (
        setter("variants", 1, "entry", "abort"),
        r"manifest.json variants\[1\].entry is \"abort\" but the kernel library was compiled for \"aotc_run_1\"",
    ),
    "a variant dropped": (
        lambda m: m["variants"].pop(),
        r"manifest.json variants has 1 entries but the kernel library was compiled for 2",
    ),
    "no variants": (lambda m: m.pop("variants"), r"manifest.json variants is null"),
    "first variant differs from the top level": (
        setter("inputs", 0, "shape", [2, 8]),
        r"manifest.json inputs\[0\].shape is \[2, 8\] but the kernel library was compiled for \[4, 8\]",
    ),
}


@pytest.mark.parametrize("case", sorted(VARIANT_CASES))
def test_a_manifest_whose_variants_lie_is_refused(tiny2, runner, tmp_path, case):
    path, inputs, _ = tiny2
    edit, message = VARIANT_CASES[case]
    report = runner.attempt(rezip(path, str(tmp_path / "bad.aotc"), edit), inputs)
    assert report["status"] == "PackageError", report
    assert re.search(message, report["message"]), report["message"]


def test_a_single_shape_manifest_may_not_claim_variants(tiny, runner, tmp_path):
    def edit(m: dict) -> None:
        m["variants"] = [{"entry": "abort"}]

    report = runner.attempt(rezip(tiny[0], str(tmp_path / "bad.aotc"), edit), tiny[1])
    assert report["status"] == "PackageError"
    assert (
        "manifest.json has variants but the kernel library was compiled for one set of input shapes"
        in (report["message"])
    )


def test_every_variant_of_an_unmodified_package_runs_in_the_child_as_in_process(tiny2, runner):
    path, inputs, expected = tiny2
    report = runner.attempt(path, inputs)
    assert report["status"] == "ok" and report["outputs"] == expected == report["profiled"]


@pytest.mark.parametrize("case", sorted(TESTER_CASES))
def test_a_manifest_that_lies_is_refused_before_any_code_runs(tiny, runner, tmp_path, case):
    path, inputs, _ = tiny
    edit, message = TESTER_CASES[case]
    bad = rezip(path, str(tmp_path / "bad.aotc"), edit)
    report = runner.attempt(bad, inputs)
    assert report["status"] == "PackageError", report
    assert "bad.aotc" in report["message"]
    assert re.search(message, report["message"]), report["message"]


@pytest.mark.parametrize("case", sorted(TESTER_CASES))
def test_inspect_does_not_call_a_lying_package_intact(tiny, tmp_path, case):
    path, _, _ = tiny
    bad = rezip(path, str(tmp_path / "bad.aotc"), TESTER_CASES[case][0])
    with pytest.raises(PackageError, match=TESTER_CASES[case][1]):
        describe_package(bad)


def test_an_unmodified_package_runs_in_the_child_as_in_process(tiny, runner):
    path, inputs, expected = tiny
    report = runner.attempt(path, inputs)
    assert report == {"status": "ok", "outputs": expected, "profiled": expected}


def test_informational_fields_may_change(tiny, runner, tmp_path):
    path, inputs, expected = tiny

    def edit(m: dict) -> None:
        m["name"] = "renamed"
        m["provenance"]["model"] = "other.onnx"
        m["kernels"][0]["task"] = "something else"

    report = runner.attempt(rezip(path, str(tmp_path / "ok.aotc"), edit), inputs)
    assert report["status"] == "ok" and report["outputs"] == expected


# ----------------------------------------------------------------------------- format version, digest, members


def test_format_1_is_refused_with_a_rebuild_hint(tiny, tmp_path):
    path, _, _ = tiny
    old = rezip(path, str(tmp_path / "old.aotc"), setter("format_version", 1))
    with pytest.raises(
        PackageError, match="old.aotc: package format 1 predates plan checks; rebuild it with this aotc"
    ):
        aotc_runtime.load(old)
    assert aotc_runtime.FORMAT_VERSION == 2


def test_digest_is_the_sha256_of_manifest_json(tiny):
    path, _, _ = tiny
    with zipfile.ZipFile(path) as zf:
        expected = hashlib.sha256(zf.read("manifest.json")).hexdigest()
    assert aotc_runtime.verify_package(path).digest == expected
    assert rtpackage.read_package(path).digest == expected
    assert f"digest        sha256:{expected}" in describe_package(path)


def test_signature_json_is_the_one_unlisted_member_allowed(tiny, tmp_path):
    path, _, _ = tiny
    signed = rezip(path, str(tmp_path / "signed.aotc"), extra=[("signature.json", b'{"anything": 1}')])
    assert aotc_runtime.verify_package(signed).signature == b'{"anything": 1}'
    assert aotc_runtime.verify_package(path).signature is None
    assert "signature     none (unsigned)" in describe_package(path)
    other = rezip(path, str(tmp_path / "other.aotc"), extra=[("signature.txt", b"x")])
    with pytest.raises(PackageError, match="member signature.txt is not listed"):
        aotc_runtime.verify_package(other)


# ----------------------------------------------------------------------------- the library's own plan and symbols


def library_of(path: str) -> bytes:
    with zipfile.ZipFile(path) as zf:
        return zf.read("lib/model.so")


def with_library(src: str, dst: str, library: bytes, edit=None) -> str:
    return rezip(src, dst, edit, members={"lib/model.so": library}, rehash=True)


def test_the_library_defines_what_the_plan_calls(tiny):
    image = read_elf(library_of(tiny[0]))
    assert image.arch == rtpackage.host_arch()
    defined = image.defined_functions()
    assert {
        "aotc_run",
        "k_add",
        "k_relu",
        "aotc_get_max_threads",
        "aotc_set_num_threads",
        "aotc_set_call_threads",
    } <= defined
    assert "abort" not in defined and "malloc" not in defined  # imported, not defined
    assert json.loads(image.section(".aotc_plan")[:-1])["entry"] == "aotc_run"


def test_a_library_without_a_plan_is_refused(tiny, tmp_path):
    path = tiny[0]
    library = library_of(path).replace(b".aotc_plan", b".aotc_junk")
    bad = with_library(path, str(tmp_path / "noplan.aotc"), library)
    with pytest.raises(PackageError, match=r"noplan.aotc: its kernel library carries no execution plan"):
        aotc_runtime.load(bad)


def test_a_plan_calling_a_symbol_the_library_only_imports_is_refused(tiny, tmp_path):
    """Plan and manifest name `free` as a kernel the library imports: dlsym would find libc's."""
    doc = plan_document(tiny_spec(), aotc_runtime.read_manifest(tiny[0])["weights"]["nbytes"])
    doc["kernels"][1]["symbol"] = doc["execution_plan"][1]["kernel"] = "free"
    own = ["aotc_run", "k_add", "aotc_get_max_threads", "aotc_set_num_threads", "aotc_set_call_threads"]
    library = synthetic_library(62, 64, encode_plan(doc), own, imported=["free"])

    def edit(m: dict) -> None:
        m["kernels"][1]["symbol"] = m["execution_plan"][1]["kernel"] = "free"

    bad = with_library(tiny[0], str(tmp_path / "free.aotc"), library, edit)
    with pytest.raises(
        PackageError, match="free.aotc: its kernel library does not define free, which the plan calls"
    ):
        aotc_runtime.load(bad)


@pytest.mark.parametrize(
    "field, value, message",
    [
        (
            ("workspace_bytes",),
            100,
            r"execution_plan\[0\].args\[2\] covers bytes \[64, 192\) of a 100-byte workspace",
        ),
        (
            ("execution_plan", 1, "args", 1, "index"),
            1,
            r"execution_plan\[1\].args\[1\] refers to output 1 of 1",
        ),
        (
            ("execution_plan", 0, "args", 0, "nbytes"),
            64,
            r"args\[0\] is 64 bytes but k_add was compiled for 128",
        ),
        (("execution_plan", 0, "kernel"), "k_nope", "calls k_nope, which is not one of its kernels"),
        (("inputs", 0, "dtype"), "object", "unsupported dtype 'object'"),
        (("entry",), "k_add", "names the kernel k_add twice"),
        (("plan_version",), 3, "this runtime reads 1 and 2"),
    ],
)
def test_an_inconsistent_plan_is_refused(field, value, message):
    doc = plan_document(tiny_spec(), 192)
    parse_plan(encode_plan(doc))
    target = doc
    for key in field[:-1]:
        target = target[key]
    target[field[-1]] = value
    with pytest.raises(PlanError, match=message):
        parse_plan(encode_plan(doc))


@pytest.mark.parametrize(
    "field, value, message",
    [
        (
            ("variants", 1, "workspace_bytes"),
            32,
            r"variants\[1\].execution_plan\[0\].args\[2\] covers bytes \[0, 64\) of a 32-byte workspace",
        ),
        (
            ("variants", 1, "execution_plan", 1, "args", 0, "offset"),
            64,  # inside the first variant's 192-byte workspace, outside its own
            r"variants\[1\].execution_plan\[1\].args\[0\] covers bytes \[64, 128\) of a 64-byte workspace",
        ),
        (
            ("variants", 1, "execution_plan", 0, "args", 0, "nbytes"),
            128,
            r"variants\[1\].execution_plan\[0\].args\[0\] is 128 bytes but k_add_half was compiled for 64",
        ),
        (
            ("variants", 1, "execution_plan", 0, "kernel"),
            "k_add",  # the first variant's kernel, of twice the size: it would read past x[2, 8]
            r"variants\[1\].execution_plan\[0\] passes 3 arguments|args\[0\] is 64 bytes but k_add was compiled for 128",
        ),
        (
            ("variants", 1, "inputs", 0, "shape"),
            [4, 8],
            r"variants\[1\].execution_plan\[0\].args\[0\] is 64 bytes|has the input shapes of variants\[0\]",
        ),
        (("variants", 1, "entry"), "aotc_run", "names an entry symbol twice"),
        (("variants", 1, "entry"), "k_add", "names the kernel k_add twice"),
        (("variants", 1, "outputs", 0, "name"), "z", r"variants\[1\].outputs differ from variants\[0\]'s"),
        (("variants", 1, "outputs", 0, "dtype"), "float64", r"variants\[1\].outputs differ|compiled for"),
        (("variants",), [], "the plan's variants list is empty"),
        (("variants", 1, "extra"), 1, r"variants\[1\] must have exactly the fields"),
        (("entry",), "aotc_run", r"the plan has fields .*expected"),
    ],
)
def test_an_inconsistent_variant_plan_is_refused(field, value, message):
    doc = plan_document(variants_spec(), 192)
    assert doc["plan_version"] == 2 and [v["entry"] for v in doc["variants"]] == ["aotc_run", "aotc_run_1"]
    parse_plan(encode_plan(doc))
    target = doc
    for key in field[:-1]:
        target = target[key]
    target[field[-1]] = value
    with pytest.raises(PlanError, match=message):
        parse_plan(encode_plan(doc))


def test_variant_input_shapes_must_differ():
    doc = plan_document(variants_spec(), 192)
    doc["variants"][1] = json.loads(json.dumps(doc["variants"][0]))
    doc["variants"][1]["entry"] = "aotc_run_1"
    with pytest.raises(PlanError, match=r"variants\[1\] has the input shapes of variants\[0\]"):
        parse_plan(encode_plan(doc))
    spec = variants_spec()
    spec.other_variants[0].inputs = spec.inputs
    with pytest.raises(ValueError, match=r"variant 1: input shapes \[\[4, 8\]\] appear twice"):
        write_package(spec, "/tmp/never-written.aotc")


def test_the_library_defines_every_variant_entry(tiny2):
    defined = read_elf(library_of(tiny2[0])).defined_functions()
    assert {"aotc_run", "aotc_run_1", "k_add", "k_relu", "k_add_half", "k_relu_half"} <= defined
    assert "variant     x[2, 8]: 2 kernel calls via aotc_run_1" in describe_package(tiny2[0])


# ----------------------------------------------------------------------------- ELF reader


def test_elf_reader_reads_aarch64_and_armv7_objects():
    plan = encode_plan(plan_document(tiny_spec(), 192))
    for triple, bits, arch in [("aarch64-linux-gnu", 64, "aarch64"), ("armv7a-linux-gnueabihf", 32, "arm")]:
        target = parse_target(f"llvm -mtriple={triple}")
        obj = compile_to_object(build_entry_ir(tiny_spec().calls, target, 1, 1, plan), target)
        image = read_elf(obj)
        assert (image.bits, image.arch) == (bits, arch)
        assert image.section(".aotc_plan") == plan + b"\0"


def test_malformed_elf_is_an_elf_error_never_a_crash(tiny):
    library = library_of(tiny[0])
    rng = np.random.default_rng(3)
    header_end = 64 + 4096
    shoff = int.from_bytes(library[0x28:0x30], "little")
    cases = [library[:n] for n in (0, 3, 16, 40, 63, 64, len(library) // 2, len(library) - 1)]
    for _ in range(300):
        at = int(rng.choice([rng.integers(header_end), rng.integers(shoff, len(library))]))
        flipped = bytearray(library)
        flipped[at] ^= 1 << int(rng.integers(8))
        cases.append(bytes(flipped))
    errors = 0
    for data in cases:
        try:
            image = read_elf(data)
            image.section(".aotc_plan")
            image.defined_functions()
        except ElfError:
            errors += 1
    assert errors >= 8


# ----------------------------------------------------------------------------- packages for other machines


def synthetic_library(
    machine: int, bits: int, plan: bytes, functions: list[str], imported: tuple[str, ...] = ()
) -> bytes:
    """A minimal ELF shared object: an executable .text, the plan section and a dynamic symbol table
    defining `functions` in .text and importing `imported` (what a linker would give, for the parts
    the checks read)."""
    little = "<"
    shstr = b"\0.text\0.aotc_plan\0.dynstr\0.dynsym\0.shstrtab\0"
    names_all = [*functions, *imported]
    dynstr = b"\0" + b"".join(f.encode() + b"\0" for f in names_all)
    name_at = [1 + sum(len(f) + 1 for f in names_all[:i]) for i in range(len(names_all))]
    sym = "IBBHQQ" if bits == 64 else "IIIBBH"
    entsize = struct.calcsize(little + sym)
    syms = bytes(entsize)
    for k, n in enumerate(name_at):
        shndx = 1 if k < len(functions) else 0  # .text, or undefined
        fields = (n, 0x12, 0, shndx, 0, 4) if bits == 64 else (n, 0, 4, 0x12, 0, shndx)
        syms += struct.pack(little + sym, *fields)
    ehsize = 64 if bits == 64 else 52
    blobs = [b"\xc3" * 16, plan + b"\0", dynstr, syms, shstr]
    offsets, pos = [], ehsize
    for b in blobs:
        offsets.append(pos)
        pos += len(b)
    shoff = pos
    sh = "IIQQQQIIQQ" if bits == 64 else "IIIIIIIIII"
    names = [
        shstr.index(n) for n in (b".text\0", b".aotc_plan\0", b".dynstr\0", b".dynsym\0", b".shstrtab\0")
    ]
    types, flags = [1, 1, 3, 11, 3], [0x6, 0x2, 0x2, 0x2, 0]
    links, ents = [0, 0, 0, 3, 0], [0, 0, 0, entsize, 0]
    headers = bytes(struct.calcsize(little + sh))
    for i, b in enumerate(blobs):
        headers += struct.pack(
            little + sh, names[i], types[i], flags[i], 0, offsets[i], len(b), links[i], 0, 1, ents[i]
        )
    ident = b"\x7fELF" + bytes([2 if bits == 64 else 1, 1, 1]) + bytes(9)
    hdr = "HHIQQQIHHHHHH" if bits == 64 else "HHIIIIIHHHHHH"
    header = ident + struct.pack(
        little + hdr, 3, machine, 1, 0, 0, shoff, 0, ehsize, 0, 0, struct.calcsize(little + sh), 6, 5
    )
    return header + b"".join(blobs) + headers


@pytest.mark.parametrize(
    "triple, machine, bits",
    [("aarch64-unknown-linux-gnu", 183, 64), ("armv7a-unknown-linux-gnueabihf", 40, 32)],
)
def test_a_package_for_another_machine_is_inspected_but_not_loaded(tiny, tmp_path, triple, machine, bits):
    if rtpackage.host_arch() == triple.split("-")[0][:5].replace("armv7", "arm"):
        pytest.skip("the host is that machine")
    target = parse_target(f"llvm -mtriple={triple}")
    spec = tiny_spec(target=target)
    doc = plan_document(spec, aotc_runtime.read_manifest(tiny[0])["weights"]["nbytes"])
    symbols = [
        "aotc_run",
        "k_add",
        "k_relu",
        "aotc_get_max_threads",
        "aotc_set_num_threads",
        "aotc_set_call_threads",
    ]
    library = synthetic_library(machine, bits, encode_plan(doc), symbols)

    def edit(m: dict) -> None:
        m.update(target=doc["target"], triple=doc["triple"], requires=doc["requires"])

    path = with_library(tiny[0], str(tmp_path / "cross.aotc"), library, edit)
    text = describe_package(path)
    assert "integrity     ok" in text and f"triple        {triple}" in text
    assert f"requires      {', '.join(doc['requires']) or 'no CPU extensions'}" in text
    arch = "aarch64" if machine == 183 else "arm"
    with pytest.raises(
        PackageError, match=rf"cross.aotc was compiled for {arch} \({triple}\) but this host is"
    ):
        aotc_runtime.load(path)
    wrong = with_library(
        tiny[0], str(tmp_path / "wrong.aotc"), synthetic_library(62, 64, encode_plan(doc), symbols), edit
    )
    with pytest.raises(
        PackageError, match=rf"its kernel library is x86_64 code but manifest.json triple is '{triple}'"
    ):
        describe_package(wrong)
    missing = with_library(
        tiny[0],
        str(tmp_path / "missing.aotc"),
        synthetic_library(machine, bits, encode_plan(doc), symbols[:2]),
        edit,
    )
    with pytest.raises(
        PackageError,
        match="does not define k_relu, aotc_get_max_threads, aotc_set_num_threads, aotc_set_call_threads",
    ):
        describe_package(missing)
