"""Every test runs with a private tophub store and without shared stores, so no test reads or writes
the user's `~/.cache/aotc` or depends on the shipped `tophub/` records (tests that need them set
`AOTC_HOME` / `AOTC_TOPHUB` themselves)."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def private_tophub_store(tmp_path_factory):
    patch = pytest.MonkeyPatch()
    patch.setenv("AOTC_HOME", str(tmp_path_factory.mktemp("aotc-home")))
    patch.setenv("AOTC_TOPHUB", "none")
    yield
    patch.undo()
