"""`aotc hub ...`: list, verify, prune, export, import, explain and annotate tuned records.

Exit codes: 0 ok, 1 bad input (a corrupt bundle or store, an unreadable package, nothing to export),
2 usage.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

from aotc.cli import RECIPE_SUFFIXES, HelpFormatter, add_json_argument, add_trust_arguments, print_json
from aotc.hub.bundle import BundleError, export_bundle, is_bundle, read_bundle
from aotc.hub.lookup import RecordSources, explain_package, open_sources, sources_from_paths
from aotc.hub.store import (
    HubError,
    TargetKey,
    annotate_records,
    check_store_dir,
    merge_into_store,
    prune_store,
    store_files,
    user_store_dir,
)
from aotc.progress import render_text, table
from aotc.search.records import read_record_file
from aotc.target import TargetError, parse_target


def add_hub_parser(subparsers) -> None:
    """Add `hub` and its subcommands to the CLI's subparsers."""
    hub = subparsers.add_parser(
        "hub",
        help="the tophub record store: ls, verify, prune, export, import, explain, annotate",
        formatter_class=HelpFormatter,
    )
    sub = hub.add_subparsers(dest="hub_command", metavar="COMMAND")

    def command(name: str, **kwargs) -> argparse.ArgumentParser:
        return sub.add_parser(name, formatter_class=HelpFormatter, **kwargs)

    ls = command("ls", help="records per source and target: workloads, records, best costs")
    ls.add_argument(
        "--from",
        dest="paths",
        nargs="+",
        metavar="PATH",
        help="list these record files, stores or bundles instead of the sources (default: the chain)",
    )
    ls.add_argument("--target", help="only records for this target")
    ls.add_argument("-v", "--verbose", dest="workloads", action="store_true", help="one line per workload")
    add_json_argument(ls)

    verify = command("verify", help="check a bundle, a store directory or a record file")
    verify.add_argument(
        "path", nargs="?", help="a bundle, store directory or record file (default: the user store)"
    )
    add_trust_arguments(verify)

    prune = command("prune", help="keep the best records per workload; drop failed and unknown-version lines")
    prune.add_argument("path", nargs="?", help="store directory (default: the user store)")
    prune.add_argument("--keep", type=_keep_count, default=3, help="records kept per workload and target")

    export = command("export", help="write the best record per workload for a target as a bundle")
    export.add_argument(
        "--target",
        required=True,
        help="target string, e.g. 'llvm -mcpu=znver4' (without -mattr/-num-cores: the records of that CPU)",
    )
    export.add_argument("-o", "--output", required=True, help="bundle file to write (e.g. team.tophub)")
    export.add_argument(
        "--sign", type=Path, metavar="KEY", help="sign the bundle with this Ed25519 private key (PEM)"
    )
    export.add_argument(
        "--from",
        dest="paths",
        nargs="+",
        metavar="PATH",
        help="record files, stores or bundles (default: the chain)",
    )

    imp = command("import", help="verify a bundle and merge it into the user store (best per key wins)")
    imp.add_argument("bundle", help="the .tophub bundle file or URL")
    add_trust_arguments(imp)
    imp.add_argument("--store", help="store directory (default: the user store)")

    explain = command("explain", help="per task of a package: hit / miss / stale against the sources")
    explain.add_argument("package", help="the .aotc package")
    explain.add_argument("--records", help="the recipe's records file, first in the chain")
    add_json_argument(explain)

    annotate = command(
        "annotate",
        help="give records written before structure keys existed their tasks' keys (twin transfer)",
    )
    annotate.add_argument(
        "model", type=Path, help="the recipe (.yaml) or model (.onnx, .tflite) whose tasks the records tuned"
    )
    annotate.add_argument(
        "path", nargs="?", help="store directory or record file to annotate (default: the user store)"
    )
    annotate.add_argument(
        "--target",
        help="the target whose graph passes make the tasks (default: the recipe's); "
        "use the records' own target string",
    )

    hub.set_defaults(hub_parser=hub)


def _keep_count(text: str) -> int:
    """An argparse type: records kept per key, 1 to 1000000."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 1 <= value <= 1_000_000:
        raise argparse.ArgumentTypeError(f"expected an integer from 1 to 1000000, got {value}")
    return value


def cmd_hub(args: argparse.Namespace) -> int:
    command = getattr(args, "hub_command", None)
    handlers = {
        "ls": _ls,
        "verify": _verify,
        "prune": _prune,
        "export": _export,
        "import": _import,
        "explain": _explain,
        "annotate": _annotate,
    }
    if command not in handlers:
        parser = getattr(args, "hub_parser", None)
        if parser is not None:
            parser.print_help(sys.stderr)
        return 2
    try:
        return handlers[command](args)
    except BrokenPipeError:
        raise  # the reader of our output went away: `aotc` ends quietly
    except (HubError, TargetError, OSError) as err:
        print(f"aotc hub {command}: {err}", file=sys.stderr)
        return 1


def short_target(text: str, width: int = 72) -> str:
    """A target string with a long feature list abbreviated."""
    if len(text) <= width:
        return text
    return re.sub(r"-mattr=(\S+)", lambda m: f"-mattr=<{m.group(1).count(',') + 1} features>", text)


def _sources(args) -> RecordSources:
    return sources_from_paths(args.paths) if args.paths else open_sources(None, None)


def _ls(args) -> int:
    listing = list_sources(_sources(args), parse_target(args.target) if args.target else None)
    if args.json:
        print_json({"sources": listing})
        return 0
    for src in listing:
        problem = f"  ({src['problem']})" if src["problem"] else ""
        count = sum(t["records"] for t in src["targets"])
        print(f"{src['name']}{problem}" + ("" if count or problem else "  (empty)"))
        for t in src["targets"]:
            print(
                f"  {short_target(t['target'])}: {len(t['workloads'])} workload(s), {t['records']} record(s)"
                + (f" ({t['failed']} failed)" if t["failed"] else "")
            )
            if args.workloads:
                for w in t["workloads"]:
                    best = w["best_cost_s"]
                    cost = f"best {best * 1e3:.4f} ms" if best is not None else "no valid record"
                    print(f"    {w['workload_key']}  {cost}  ({w['records']} record(s))")
        if src["foreign_lines"] or src["corrupt_lines"]:
            print(
                f"  + {src['foreign_lines']} line(s) of another format version, "
                f"{src['corrupt_lines']} corrupt line(s)"
            )
    return 0


def list_sources(sources: RecordSources, target=None) -> list[dict]:
    """Per source of the chain: its name, problem, and per target key its workloads (records, best
    cost in seconds or None), record and failed counts; only `target`'s records when given."""
    wanted = TargetKey.of(target) if target is not None else None
    sources.all_records()
    out = []
    for src in sources.sources:
        files = list(src.files)
        by_target: dict[TargetKey, list] = defaultdict(list)
        for content in files:
            for rec in content.records:
                by_target[TargetKey.of_record(rec.target, rec.host)].append(rec)
        targets = []
        for key, recs in sorted(by_target.items(), key=lambda kv: kv[0].text):
            if wanted is not None and key != wanted:
                continue
            per_workload: dict[str, list] = defaultdict(list)
            for rec in recs:
                per_workload[rec.workload_key].append(rec)
            workloads = []
            for wk, wrecs in sorted(per_workload.items()):
                best = min(r.mean_cost for r in wrecs)
                workloads.append(
                    {
                        "workload_key": wk,
                        "records": len(wrecs),
                        "best_cost_s": best if best < float("inf") else None,
                    }
                )
            targets.append(
                {
                    "target": key.text,
                    "records": len(recs),
                    "failed": sum(not r.ok for r in recs),
                    "workloads": workloads,
                }
            )
        out.append(
            {
                "name": src.name,
                "kind": src.kind,
                "location": src.location,
                "problem": src.problem or "",
                "targets": targets,
                "foreign_lines": sum(len(f.foreign) for f in files),
                "corrupt_lines": sum(len(f.corrupt) for f in files),
            }
        )
    return out


def _verify(args) -> int:
    path = Path(args.path) if args.path else user_store_dir()
    if not path.exists() and not args.path:
        print(f"the user store {path} does not exist yet: nothing to verify")
        return 0
    if not path.exists():
        print(f"aotc hub verify: {path} does not exist", file=sys.stderr)
        return 1
    if is_bundle(path):
        try:
            bundle = read_bundle(path, args.trusted_key, args.require_signature)
        except BundleError as err:
            print(f"aotc hub verify: refused: {err}", file=sys.stderr)
            return 1
        m = bundle.manifest
        print(
            f"ok: {path}: {len(bundle.records)} record(s) for {short_target(m.get('target', '?'))}, "
            f"exported by {m.get('exported_by', '?')} at {m.get('created_utc', '?')}; sha256 of every member verified; "
            f"digest sha256:{bundle.digest}; signature: {bundle.signature}"
        )
        return 0
    if path.is_dir():
        check_store_dir(path)
    files = [path] if path.is_file() else store_files(path)
    bad = 0
    for file in files:
        content = read_record_file(file)
        line = f"{file}: {len(content.records)} record(s)"
        if content.foreign:
            versions = sorted({str(f.version) for f in content.foreign})
            line += f", {len(content.foreign)} line(s) of format version {'/'.join(versions)} (not used)"
        if content.corrupt:
            bad += len(content.corrupt)
            line += f", {len(content.corrupt)} BAD line(s):"
            line += "".join(f"\n  {file}:{n}: {why}" for n, why in content.corrupt)
        print(line)
    if bad:
        print(
            f"aotc hub verify: {bad} corrupt or invalid line(s); `aotc hub prune` drops them", file=sys.stderr
        )
        return 1
    print(f"ok: {len(files)} file(s) verified")
    return 0


def _prune(args) -> int:
    path = Path(args.path) if args.path else user_store_dir()
    if not path.is_dir():
        print(f"aotc hub prune: {path} is not a store directory", file=sys.stderr)
        return 1
    print(f"{path}: {prune_store(path, args.keep)}")
    return 0


def _export(args) -> int:
    target = parse_target(args.target)
    sources = _sources(args)
    records = [rec for rec, _ in sources.all_records()]
    manifest = export_bundle(records, export_key(target, args.target, records), args.output, args.sign)
    print(
        f"wrote {args.output}: best record of {len(manifest['workloads'])} workload(s) for "
        f"{short_target(str(target))}, from {len(records)} record(s)"
    )
    return 0


def export_key(target, text: str, records: list) -> TargetKey:
    """The target key to export: the target's own when the user named everything (-mattr and
    -num-cores), else the one key of that CPU's records that agrees with what was named (a host build's
    records carry every feature of the host, and its core count when given): `llvm -mcpu=znver4` or
    `llvm -mcpu=znver4 -num-cores=8` as users type them. Several such keys are a HubError listing them."""
    wanted = TargetKey.of(target)
    named_features, named_cores = "-mattr" in text, "-num-cores" in text
    if (named_features and named_cores) or "native" in text or "-mcpu" not in text:
        return wanted
    keys = {
        key
        for rec in records
        if (key := TargetKey.of_record(rec.target, rec.host)).kind == wanted.kind
        and (key.arch, key.cpu) == (wanted.arch, wanted.cpu)
        and (not named_features or key.features == wanted.features)
        and (not named_cores or key.cores == wanted.cores)
    }
    if len(keys) > 1:
        listed = "\n  ".join(sorted(k.text for k in keys))
        raise HubError(
            f"records of {len(keys)} {wanted.cpu} targets; name one with its -mattr/-num-cores:\n  {listed}"
        )
    return keys.pop() if keys else wanted


def _import(args) -> int:
    try:
        bundle = read_bundle(args.bundle, args.trusted_key, args.require_signature)
    except BundleError as err:
        print(f"aotc hub import: refused, nothing written: {err}", file=sys.stderr)
        return 1
    store = Path(args.store) if args.store else user_store_dir()
    added, kept = merge_into_store(store, bundle.records)
    print(
        f"imported {args.bundle} (signature: {bundle.signature}) into {store}: {added} record(s) added, "
        f"{kept} not (the store already has one as fast or faster)"
    )
    return 0


def _explain(args) -> int:
    sources = open_sources(Path(args.records) if args.records else None, None)
    target, rows = explain_package(args.package, sources)
    counts = {s: sum(r.status == s for _, r in rows) for s in ("hit", "miss", "stale")}
    if args.json:
        print_json(
            {
                "package": str(args.package),
                "target": str(target),
                "sources": [{"name": s.name, "problem": s.problem or ""} for s in sources.sources],
                "tasks": [
                    {"task": task, "status": r.status, "reason": r.reason, "source": r.source}
                    for task, r in rows
                ],
                "counts": counts,
            }
        )
        return 0
    print(f"package {args.package}, target {short_target(str(target))}")
    print(
        "sources: "
        + ", ".join(s.name + (f" (skipped: {s.problem})" if s.problem else "") for s in sources.sources)
    )
    listing = render_text(table(["Task", "Result"], [[task, str(result)] for task, result in rows]))
    print("\n".join("  " + line for line in listing.splitlines()))
    print(f"{counts['hit']} hit, {counts['miss']} miss, {counts['stale']} stale")
    return 0


def _annotate(args) -> int:
    from dataclasses import replace

    from aotc.build import load_variants, variant_tasks
    from aotc.recipe import MODEL_SUFFIXES, Recipe, load_recipe

    source: Path = args.model
    suffix = source.suffix.lower()
    if suffix not in (*RECIPE_SUFFIXES, *MODEL_SUFFIXES):
        print(
            f"aotc hub annotate: {source}: expected a recipe (.yaml) or a model (.onnx, .tflite)",
            file=sys.stderr,
        )
        return 2
    if not source.is_file():
        raise HubError(f"{source}: no such file")
    try:  # a recipe, frontend or graph error names the file, key, operator or value
        recipe = load_recipe(source) if suffix in RECIPE_SUFFIXES else Recipe(model=source)
        if args.target:
            recipe = replace(recipe, target=str(parse_target(args.target)))
        tasks = variant_tasks(load_variants(recipe))
    except ValueError as err:
        print(f"aotc hub annotate: {source}: {err}", file=sys.stderr)
        return 1
    path = Path(args.path) if args.path else user_store_dir()
    if is_bundle(path):  # its records are covered by its manifest's digests (and signature)
        raise HubError(
            f"{path} is a bundle: import it into a store (aotc hub import), then annotate the store"
        )
    report = annotate_records(path, {task.dag.fingerprint: task.dag.structure_key for task in tasks})
    print(f"{path}: {report} ({len(tasks)} task(s) of {source}, target {short_target(recipe.target)})")
    return 0
