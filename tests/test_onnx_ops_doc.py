"""docs/onnx-operators.md is what tests/onnx_ops_doc.py generates from the frontend's operator table and the
conformance suite's exclusions (issue 19: the README's list of operators is generated, not written by hand)."""

from .onnx_ops_doc import DOC, render


def test_the_committed_operator_list_is_the_generated_one():
    assert DOC.read_text() == render(), (
        f"{DOC.name} is stale: rewrite it with `python -m tests.onnx_ops_doc --write` and commit it"
    )


def test_the_operator_list_names_every_converted_operator_and_exclusion():
    from aotc.frontend.onnx import VERSIONS, supported_operators

    from .onnx_conformance import EXCLUDED

    text = render()
    assert all(f"| {op} |" in text or f"`{op}`" in text for op in supported_operators())
    assert all(f"| {op} | {', '.join(map(str, v))} |" in text for op, v in VERSIONS.items())
    assert all(reason in text for _, reason in EXCLUDED)
