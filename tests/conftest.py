"""Every test runs with a private tophub store and without shared stores, so no test reads or writes
the user's `~/.cache/aotc` or depends on the shipped `aotc/tophub/` records (tests that need them set
`AOTC_HOME` / `AOTC_TOPHUB` themselves). The emulated aarch64 Python is the exception: it is the user's."""

import pytest

from aotc.emulator import sysroot_dir


@pytest.fixture(autouse=True, scope="session")
def private_tophub_store(tmp_path_factory):
    patch = pytest.MonkeyPatch()
    # The emulated aarch64 Python is made once per user, not once per test session's AOTC_HOME.
    patch.setenv("AOTC_SYSROOT_AARCH64", str(sysroot_dir("aarch64")))
    patch.setenv("AOTC_HOME", str(tmp_path_factory.mktemp("aotc-home")))
    patch.setenv("AOTC_TOPHUB", "none")
    yield
    patch.undo()


@pytest.fixture
def isolated_home(tmp_path, monkeypatch):
    """A test's own AOTC_HOME (returned), with neither shared stores nor the shipped `aotc/tophub/`."""
    monkeypatch.setenv("AOTC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("AOTC_TOPHUB", raising=False)
    monkeypatch.setenv("AOTC_SHIPPED_TOPHUB", "none")
    return tmp_path / "home"
