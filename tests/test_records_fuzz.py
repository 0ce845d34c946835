"""Fuzzing the trust boundary of tuned records (issue 20, acceptance): mutated record lines and bundles
pushed through parsing, `aotc hub verify`, `aotc hub import` and the build's lookup, in process (records
are data; no native code runs). Every case ends in a clean refusal naming the file or line, or in
accepted records that are all valid; a refused import leaves the store byte for byte as it was; and
after every case the lookup still chooses a valid record for the key. A seeded few hundred cases run by
default, thousands under `-m slow`."""

import argparse
import hashlib
import io
import json
import random
import warnings
import zipfile
from pathlib import Path

import pytest

from aotc.hub import BundleError, open_sources, read_bundle
from aotc.hub.bundle import bundle_bytes
from aotc.hub.cli import add_hub_parser, cmd_hub
from aotc.hub.store import TargetKey, append_to_store, store_files
from aotc.schedule.state import State
from aotc.search.common import MeasureResult
from aotc.search.records import Record, record_problem
from aotc.target import parse_target
from aotc.topi.workloads import make_workload

SKX = parse_target("llvm -mcpu=skylake-avx512 -num-cores=4")
FIELDS = [
    "v",
    "workload_key",
    "fingerprint",
    "target",
    "hw",
    "steps",
    "costs",
    "error",
    "error_msg",
    "timestamp",
    "aotc_version",
    "host",
    "noise",
    "flops",
]
ODD_VALUES = [None, True, 0, -1, 1e308, -0.0, "", "x", [], {}, [None], {"a": 1}, 2**70]
ODD_COSTS = [
    [float("nan")],
    [float("inf")],
    [float("-inf")],
    [0.0],
    [-1.0],
    [-1e-3],
    [1e300],
    [1e-300],
    [],
    ["1e-5"],
    [None],
    [1e-5, float("nan")],
    [True],
]
GARBAGE_STEPS = [
    "steps",
    [1, 2, 3],
    [["ZZ", 0]],
    [["SP"]],
    [["SP", 0, 0, 16, [float("inf")], 1]],
    [["SP", 2, 0, 16, [10**30], 1]],
    [["SP", 99, 0, 16, [2], 1]],
    [["AN", 0, 0, 99]],
    [["RE", 0, "abc"]],
    [["CHR", 0, None, [1]]],
    [[None]],
    [{}],
]


@pytest.fixture(autouse=True)
def home(isolated_home):
    return isolated_home


def hub(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="aotc")
    add_hub_parser(parser.add_subparsers(dest="command"))
    return cmd_hub(parser.parse_args(["hub", *argv]))


def dag():
    return make_workload("matmul", [16, 16, 16])


def measured(cost: float, factor: int) -> Record:
    d = dag()
    state = State.initial(d).split(2, 0, [factor])
    return Record.from_result(d, SKX, state, MeasureResult([cost, cost * 1.01]))


# ----------------------------------------------------------------------------- mutations


def mutate_line(rng: random.Random, base: dict) -> str:
    """One mutated record line: a field deleted or retyped, odd costs, garbage steps, a wrong workload
    key, or the JSON cut short."""
    obj = json.loads(json.dumps(base))
    kind = rng.choice(["delete", "retype", "costs", "steps", "key", "truncate", "noise", "several"])
    if kind == "delete":
        obj.pop(rng.choice(FIELDS), None)
    elif kind == "retype":
        obj[rng.choice(FIELDS)] = rng.choice(ODD_VALUES)
    elif kind == "costs":
        obj["costs"] = rng.choice(ODD_COSTS)
    elif kind == "steps":
        obj["steps"] = rng.choice(GARBAGE_STEPS)
    elif kind == "key":
        choice = rng.randrange(4)
        if choice == 0:
            obj["workload_key"] = "f" * 32
        elif choice == 1:
            obj["fingerprint"] = "0" * 64
        elif choice == 2:
            obj["workload_key"] = obj["fingerprint"] = ""
        else:
            obj["target"] = rng.choice(["", "llvm -mcpu=nonsense", "cuda -arch=sm_80", "garbage"])
    elif kind == "noise":
        obj["noise"] = rng.choice(
            [{"interference": float("nan"), "spread": 0, "retries": 0}, {"interference": 2}, "quiet"]
        )
    elif kind == "several":
        for _ in range(3):
            obj[rng.choice(FIELDS)] = rng.choice(ODD_VALUES)
    text = json.dumps(obj)
    if kind == "truncate":
        text = text[: rng.randrange(len(text))]
    return text


def bundle_of_lines(lines: list[str]) -> bytes:
    """A well-formed bundle (manifest listing the member's true sha256) around arbitrary lines."""
    _, manifest = bundle_bytes([measured(3e-5, 2)], TargetKey.of(SKX))
    body = "".join(line + "\n" for line in lines).encode()
    manifest["members"]["records.jsonl"] = {
        "sha256": hashlib.sha256(body).hexdigest(),
        "bytes": len(body),
        "lines": len(lines),
    }
    return zip_of({"manifest.json": json.dumps(manifest).encode(), "records.jsonl": body})


def zip_of(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def mutate_bundle(rng: random.Random, good: bytes, lines: list[str]) -> bytes:
    """A damaged bundle: bit flips, truncation, a zip bomb, extra members, ../ member names."""
    kind = rng.choice(["flip", "truncate", "bomb", "extra", "dotdot", "lines"])
    if kind == "flip":
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return bytes(data)
    if kind == "truncate":
        return good[: rng.randrange(len(good))]
    members = {n: zipfile.ZipFile(io.BytesIO(good)).read(n) for n in ("manifest.json", "records.jsonl")}
    if kind == "bomb":
        return zip_of(members | {"records.jsonl": b" " * rng.choice([1 << 20, 8 << 20, 64 << 20])})
    if kind == "extra":
        return zip_of(members | {rng.choice(["extra.bin", "signature.json", "records.jsonl.bak"]): b"x"})
    if kind == "dotdot":
        name = rng.choice(["../records.jsonl", "/etc/records.jsonl", "a/../../manifest.json"])
        return zip_of(members | {name: members["records.jsonl"]})
    return bundle_of_lines(lines + [mutate_line(rng, json.loads(lines[0]))])


# ----------------------------------------------------------------------------- checks


def store_bytes(store: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in store_files(store)}


def chosen_is_valid(genuine: Record) -> None:
    """The lookup picks a valid record for the key, never one faster than any valid record claims."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = open_sources(None, None).lookup(dag(), SKX)
    assert found.status == "hit", found
    assert record_problem(found.record) == ""
    assert found.record.mean_cost >= genuine.mean_cost * 0.999


def check_line(text: str) -> None:
    try:
        rec = Record.from_json(text)
    except ValueError:
        return
    assert record_problem(rec) == ""


def check_bundle(path: Path, store: Path, genuine: Record, capsys) -> None:
    try:
        bundle = read_bundle(path)
    except BundleError as err:
        assert str(path) in str(err)
        refused = True
    else:
        assert all(record_problem(r) == "" for r in bundle.records)
        refused = False
    before = store_bytes(store)
    verify = hub("verify", str(path))
    imported = hub("import", str(path), "--store", str(store))
    err = capsys.readouterr().err
    assert verify == imported == (1 if refused else 0)
    if refused:
        assert str(path) in err
        assert store_bytes(store) == before
    for p in store_files(store):
        for line in p.read_text().splitlines():
            assert record_problem(Record.from_json(line)) == ""
    chosen_is_valid(genuine)


def run_cases(n: int, seed: int, tmp_path: Path, home: Path, capsys) -> None:
    rng = random.Random(seed)
    genuine = measured(1e-5, 4)
    store = home / "tophub"
    append_to_store(store, [genuine])
    base = json.loads(measured(2e-5, 8).to_json())  # slower: an accepted mutation never displaces it
    good_lines = [json.dumps(base), measured(2.5e-5, 16).to_json()]
    good = bundle_of_lines(good_lines)
    path = tmp_path / "case.tophub"
    for case in range(n):
        if case % 2 == 0:
            text = mutate_line(rng, base)
            check_line(text)
            # the same line, poisoning the store file itself: lookup, verify and prune stay sound
            file = store_files(store)[0]
            saved = file.read_bytes()
            file.write_bytes(saved + text.encode(errors="replace") + b"\n")
            chosen_is_valid(genuine)
            assert hub("verify", str(store)) in (0, 1)
            assert hub("prune", str(store)) == 0
            chosen_is_valid(genuine)
            file.write_bytes(saved)
            path.write_bytes(bundle_of_lines([*good_lines, text]))
        else:
            path.write_bytes(mutate_bundle(rng, good, good_lines))
        check_bundle(path, store, genuine, capsys)


def test_fuzzed_records_and_bundles_end_in_refusals_or_valid_records(tmp_path, home, capsys):
    run_cases(300, 20, tmp_path, home, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(10))
def test_fuzzed_records_and_bundles_many(tmp_path, home, capsys, seed):
    run_cases(500, 1000 + seed, tmp_path, home, capsys)
