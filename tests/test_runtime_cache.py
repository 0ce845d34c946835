"""The runtime's library cache: private directories only, and the library loaded is the one verified."""

from __future__ import annotations

import ctypes
import hashlib
import os
import stat
import tempfile
import time
import warnings

import aotc_runtime.cache as cache
import pytest
from aotc_runtime.cache import UnsafeCacheDirectory, clean_cache, install_library, open_private_directory

from aotc.codegen.llvm import compile_to_object, link_shared
from aotc.target import host_target

DAY = 24 * 3600


def shared_library(tmp_path_factory, value: int) -> bytes:
    """A tiny shared library exporting `int which(void)` that returns `value`."""
    ir = f"define i32 @which() {{\n  ret i32 {value}\n}}\n"
    path = tmp_path_factory.mktemp("lib") / f"which{value}.so"
    link_shared([compile_to_object(ir, host_target(), opt_level=0)], str(path))
    return path.read_bytes()


@pytest.fixture(scope="module")
def libraries(tmp_path_factory):
    """Two different libraries, whose `which()` returns 1 and 2."""
    return shared_library(tmp_path_factory, 1), shared_library(tmp_path_factory, 2)


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    """A primary cache path (not yet created) and a private temporary directory standing in for /tmp."""
    primary = tmp_path / "cache"
    shared_tmp = tmp_path / "tmp"
    shared_tmp.mkdir()
    monkeypatch.setenv("AOTC_RUNTIME_CACHE", str(primary))
    monkeypatch.setattr(tempfile, "tempdir", str(shared_tmp))
    return primary, shared_tmp


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def unique(data: bytes) -> bytes:
    """`data` with bytes appended so its sha256 is one no earlier test installed in this process."""
    return data + os.urandom(16)


def loaded_file(path: str) -> str:
    """The file a path returned by install_library designates (through /proc/self/fd when it is one)."""
    return os.readlink(path) if path.startswith("/proc/self/fd/") else path


def test_the_cache_is_created_private_and_holds_the_library(dirs):
    primary, _ = dirs
    data = unique(b"kernel library bytes")
    path = install_library(data, sha(data))
    st = os.lstat(primary)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
    with open(path, "rb") as f:
        assert f.read() == data
    assert loaded_file(path) == str(primary / f"{sha(data)}.so")
    assert install_library(data, sha(data)) == path


def make_unsafe(kind: str, path, tmp_path, monkeypatch) -> None:
    if kind == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        path.symlink_to(tmp_path / "elsewhere")
    elif kind == "a-file":
        path.write_bytes(b"")
    else:
        path.mkdir(mode=0o700)
        path.chmod({"world-writable": 0o777, "group-writable": 0o770}.get(kind, 0o700))
    if kind == "foreign-owned":
        if os.getuid() == 0:
            os.chown(path, 65534, 65534)
        else:  # a file cannot be given away: make the check see another user instead
            monkeypatch.setattr(os, "getuid", lambda: path.stat().st_uid + 1)


@pytest.mark.parametrize(
    "kind, why",
    [
        ("world-writable", "writable by group or others"),
        ("group-writable", "writable by group or others"),
        ("symlink", "symbolic link"),
        ("foreign-owned", "owned by uid"),
        ("a-file", "not a directory"),
    ],
)
def test_an_unsafe_cache_directory_is_refused(tmp_path, monkeypatch, kind, why):
    path = tmp_path / "cache"
    make_unsafe(kind, path, tmp_path, monkeypatch)
    with pytest.raises(UnsafeCacheDirectory, match=why):
        os.close(open_private_directory(str(path)))


def test_an_unsafe_primary_cache_is_not_used(dirs, tmp_path):
    primary, shared_tmp = dirs
    primary.mkdir()
    primary.chmod(0o777)
    data = unique(b"kernel library bytes")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = install_library(data, sha(data))
    assert os.listdir(primary) == []
    assert [str(w.message) for w in caught if "writable by group or others" in str(w.message)]
    assert loaded_file(path) == str(shared_tmp / f"aotc_runtime-{os.getuid()}" / f"{sha(data)}.so")


def test_a_tmp_fallback_another_user_made_first_is_not_used(dirs, tmp_path, monkeypatch):
    primary, shared_tmp = dirs
    (tmp_path / "not-a-dir").write_bytes(b"")
    monkeypatch.setenv("AOTC_RUNTIME_CACHE", str(tmp_path / "not-a-dir" / "cache"))  # unwritable
    planted = shared_tmp / f"aotc_runtime-{os.getuid()}"
    planted.mkdir()
    planted.chmod(0o777)  # as another user would leave it, so that they can swap its files
    data = unique(b"kernel library bytes")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = install_library(data, sha(data))
    assert os.listdir(planted) == []
    assert [w for w in caught if w.category is RuntimeWarning and str(planted) in str(w.message)]
    where = os.path.dirname(loaded_file(path))
    st = os.lstat(where)
    assert where != str(planted) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700
    with open(path, "rb") as f:
        assert f.read() == data


def test_a_library_swapped_after_verification_is_not_the_one_loaded(dirs, libraries):
    primary, _ = dirs
    good, evil = libraries
    good = unique(good)
    path = install_library(good, sha(good))
    entry = primary / f"{sha(good)}.so"
    swapped = primary / "swap.tmp"
    swapped.write_bytes(evil)
    os.replace(swapped, entry)  # the window between the check and dlopen
    assert ctypes.CDLL(path).which() == 1
    # Loading by the entry's path, as the cache did before, runs the swapped-in library.
    assert ctypes.CDLL(str(entry)).which() == 2
    assert ctypes.CDLL(install_library(good, sha(good))).which() == 1


def test_a_damaged_or_symlinked_entry_is_replaced_by_a_verified_file(dirs, tmp_path):
    primary, _ = dirs
    data = unique(b"kernel library bytes")
    primary.mkdir(mode=0o700)
    outside = tmp_path / "outside.so"
    outside.write_bytes(data)  # right content, but a file the cache does not control
    (primary / f"{sha(data)}.so").symlink_to(outside)
    path = install_library(data, sha(data))
    entry = primary / f"{sha(data)}.so"
    assert not entry.is_symlink() and entry.read_bytes() == data
    assert loaded_file(path) == str(entry)


# ----------------------------------------------------------------------------- cleaning


def make_entries(directory, ages_days: list[float], size: int = 100, now: float = 0.0) -> list[str]:
    """Fake entries last used `ages_days` before `now`; returns their names, in the given order."""
    names = []
    for i, age in enumerate(ages_days):
        name = f"{hashlib.sha256(str(i).encode()).hexdigest()}.so"
        path = directory / name
        path.write_bytes(b"x" * size)
        stamp = now - age * DAY
        os.utime(path, (stamp, stamp))
        names.append(name)
    return names


def test_clean_removes_only_entries_beyond_the_bounds_and_unused_for_a_day(tmp_path):
    d = tmp_path / "cache"
    d.mkdir(mode=0o700)
    now = time.time()
    names = make_entries(d, [0.1, 3, 0.5, 2, 5, 0.2], now=now)
    (d / "unrelated.txt").write_text("not the cache's")
    old_tmp, young_tmp = ".0123456789abcdef.00aa.tmp", ".0123456789abcdef.00bb.tmp"
    (d / old_tmp).write_bytes(b"")
    os.utime(d / old_tmp, (now - 2 * DAY, now - 2 * DAY))
    (d / young_tmp).write_bytes(b"")
    # By last use: 0.1, 0.2, 0.5, 2, 3, 5 days; two kept by the bound, and of the rest only those
    # unused for more than a day go (0.5 stays: another process may have just opened it).
    removed = clean_cache(str(d), keep=names[4], max_entries=2, now=now)
    assert sorted(removed) == sorted([names[1], names[3], old_tmp])
    assert sorted(os.listdir(d)) == sorted(
        [names[0], names[2], names[4], names[5], "unrelated.txt", young_tmp]
    )


def test_clean_bounds_the_total_size(tmp_path):
    d = tmp_path / "cache"
    d.mkdir(mode=0o700)
    now = time.time()
    names = make_entries(d, [2, 3, 4, 5], size=1000, now=now)
    assert clean_cache(str(d), max_bytes=2500, now=now) == [names[2], names[3]]
    assert clean_cache(str(d), max_bytes=2500, now=now) == []


def test_installing_a_new_library_cleans_old_entries(dirs):
    primary, _ = dirs
    primary.mkdir(mode=0o700)
    names = make_entries(primary, [10 + i for i in range(cache.MAX_ENTRIES)], now=time.time())
    data = unique(b"kernel library bytes")
    install_library(data, sha(data))
    left = set(os.listdir(primary))
    assert len(left) == cache.MAX_ENTRIES and f"{sha(data)}.so" in left and names[-1] not in left
