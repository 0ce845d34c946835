"""The tophub record store: where tuned records live, how a build finds them, and how teams share them."""

from aotc.hub.bundle import BundleError, HubWarning, export_bundle, fetch_bundle, read_bundle
from aotc.hub.lookup import Lookup, RecordSources, explain_package, open_sources, sources_from_paths
from aotc.hub.store import (
    HubError,
    TargetKey,
    merge_into_store,
    prune_store,
    shipped_store_dir,
    user_store_dir,
)
from aotc.hub.transfer import Transfer, find_transfers
from aotc.hub.warm import warm_start

__all__ = [
    "BundleError",
    "HubError",
    "HubWarning",
    "Lookup",
    "RecordSources",
    "TargetKey",
    "Transfer",
    "explain_package",
    "export_bundle",
    "fetch_bundle",
    "find_transfers",
    "merge_into_store",
    "open_sources",
    "prune_store",
    "read_bundle",
    "shipped_store_dir",
    "sources_from_paths",
    "user_store_dir",
    "warm_start",
]
