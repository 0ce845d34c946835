"""The README's example must keep working."""

import pathlib
import re

import numpy as np


def test_readme_example_runs_and_is_correct(tmp_path, monkeypatch):
    readme = (pathlib.Path(__file__).parent.parent / "README.md").read_text()
    section = readme[readme.index("## The compiler core in one example") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    code = code.replace("/tmp/gemm.so", str(tmp_path / "gemm.so"))
    rng = np.random.default_rng(0)
    a = rng.standard_normal((512, 512)).astype("float32")
    b = rng.standard_normal((512, 512)).astype("float32")
    c = np.zeros((512, 512), "float32")
    exec(code, {"a": a, "b": b, "c": c})
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-3)
