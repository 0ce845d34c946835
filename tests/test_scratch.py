"""Scratch folders (`aotc.files.ScratchDir`): a process that ends without exit handlers (killed, or
`os._exit` as a pytest-xdist worker ends) leaves its folder behind, and the next folder of the same
prefix deletes it; a living owner's folder is never touched."""

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from aotc.files import SCRATCH_LOCK, UNLOCKED_SCRATCH_AGE_S, ScratchDir, remove_abandoned_scratch
from aotc.search.measure import MeasureOptions, Measurer
from aotc.target import host_target

from .test_measure import matmul_relu

ROOT = Path(__file__).resolve().parents[1]

# Makes a scratch folder in argv[1], prints its path, then ends as argv[2] says.
OWNER = textwrap.dedent(
    """
    import os, sys, time
    from aotc.files import ScratchDir

    folder = ScratchDir("aotc-test-", sys.argv[1])
    print(folder.path, flush=True)
    if sys.argv[2] == "exit":
        os._exit(0)
    time.sleep(600)
    """
)


def start_owner(base: Path, ending: str) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(base), ending], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    path = Path(proc.stdout.readline().strip())
    assert path.is_dir() and (path / SCRATCH_LOCK).exists(), path
    return proc, path


@pytest.mark.parametrize("ending", ["SIGKILL", "exit"])
def test_an_ended_owners_folder_is_deleted_by_the_next_one(tmp_path, ending):
    proc, left = start_owner(tmp_path, ending)
    if ending == "SIGKILL":
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    assert left.is_dir()  # nothing of the owner cleaned up
    mine = ScratchDir("aotc-test-", str(tmp_path))
    assert not left.exists()
    assert [p.name for p in tmp_path.iterdir()] == [Path(mine.path).name]
    mine.remove()
    assert not any(tmp_path.iterdir())


def test_a_living_owners_folder_is_kept(tmp_path):
    proc, theirs = start_owner(tmp_path, "sleep")
    try:
        mine = ScratchDir("aotc-test-", str(tmp_path))
        other = ScratchDir("aotc-test-", str(tmp_path))  # this process's own first folder is kept too
        assert theirs.is_dir() and Path(mine.path).is_dir() and Path(other.path).is_dir()
        assert remove_abandoned_scratch("aotc-test-", str(tmp_path)) == []
    finally:
        proc.kill()
        proc.wait(timeout=30)
        proc.stdout.close()
    assert remove_abandoned_scratch("aotc-test-", str(tmp_path)) == [str(theirs)]
    mine.remove()
    other.remove()


def test_a_folder_without_a_lock_is_deleted_only_when_old(tmp_path):
    """One an older aotc left (no lock file), or one being made right now."""
    fresh, old = tmp_path / "aotc-test-fresh", tmp_path / "aotc-test-old"
    unrelated = tmp_path / "other-old"
    for folder in (fresh, old, unrelated):
        folder.mkdir()
        (folder / "b7713_0.so").write_bytes(b"x")
    then = time.time() - UNLOCKED_SCRATCH_AGE_S - 60
    for folder in (old, unrelated):
        os.utime(folder, (then, then))
    assert remove_abandoned_scratch("aotc-test-", str(tmp_path)) == [str(old)]
    assert fresh.is_dir() and unrelated.is_dir() and not old.exists()


# A measurer in a process that ends by os._exit: its folder stays behind.
ABANDONED_MEASURER = textwrap.dedent(
    """
    import os
    from aotc.search.measure import MeasureOptions, Measurer
    from aotc.target import host_target
    from tests.test_measure import matmul_relu

    if __name__ == "__main__":
        m = Measurer(matmul_relu(), host_target(), MeasureOptions(n_build_workers=1))
        print(m.workdir, flush=True)
        os._exit(0)
    """
)


def test_a_measurer_deletes_the_folders_of_measurers_whose_process_ended(tmp_path, monkeypatch):
    """Every test run used to leave a few aotc-measure-* folders in /tmp, every killed build one."""
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", ABANDONED_MEASURER],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    left = Path(proc.stdout.strip())
    assert left.parent == tmp_path and left.is_dir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with Measurer(matmul_relu(), host_target(), MeasureOptions(n_build_workers=1)) as m:
        assert not left.exists()
        assert (Path(m.workdir) / SCRATCH_LOCK).exists()
    assert not any(tmp_path.iterdir())
