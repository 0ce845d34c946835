from aotc.ir.expr import Const, Var, const, free_vars, walk, walk_distinct
from aotc.ir.printer import expr_str
from aotc.ir.simplify import affine, bounds, simplify
from aotc.te.dag import read_tensors
from aotc.te.tensor import compute, placeholder


def test_linear_canonical_form_and_constant_folding():
    i, j = Var("i"), Var("j")
    assert expr_str(simplify((i + 2) * 4 + j - 8 - i * 4)) == "j"
    assert simplify(const(3) * 4 + 1) == Const(13, "int64")
    assert affine(i * 3 + (j - i) * 2 + 5) == ({i: 1, j: 2}, 5)


def test_div_mod_of_split_loops_simplify_with_ranges():
    i, j = Var("i"), Var("j")
    ranges = {i: (0, 7), j: (0, 3)}
    assert simplify((i * 4 + j) // 4, ranges) == i
    assert simplify((i * 4 + j) % 4, ranges) == j
    assert simplify((i * 8 + j + 4) // 4, ranges) == simplify(i * 2 + 1)
    # without a range for j nothing can be proven
    assert expr_str(simplify((i * 4 + j) // 4)) == "(i + (j // 4))"


def test_an_index_split_by_a_constant_and_flattened_again_is_the_index():
    """(r // C) * C + r % C = r, at any scale and under other terms: a gather of window columns reads
    pixels (w * 2 + r // 3) of 3 channels (r % 3), one contiguous run of r (window_columns)."""
    from aotc.ir.simplify import flat_affine_parts

    r, w = Var("r"), Var("w")
    assert flat_affine_parts([r // 3, r % 3], [3, 1]) == ({r: 1}, 0)
    assert flat_affine_parts([simplify(w * 2 + r // 3 - 3), r % 3], [3, 1]) == ({w: 6, r: 1}, -9)
    assert flat_affine_parts([simplify(w + r // 4), r % 4], [8, 2]) == ({w: 8, r: 2}, 0)
    forms: dict = {}  # each index's form is kept: the same index at another stride gives the same
    assert flat_affine_parts([w, r // 4, r % 4], [16, 8, 2], forms) == ({w: 16, r: 2}, 0)
    assert flat_affine_parts([r // 4, w, r % 4], [8, 1, 2], forms) == ({w: 1, r: 2}, 0)
    assert set(forms) == {w, r // 4, r % 4}
    # other multiples are left as they were, and so is an index that may be divided again: its split
    # form is what a later division simplifies against ((f // 5) * 250 + (f % 5) * 50 + j) // 250
    assert len(flat_affine_parts([r // 3, r % 3], [2, 1])[0]) == 2
    assert expr_str(simplify((r // 3) * 3 + r % 3)) == "(((r // 3) * 3) + (r % 3))"


def test_min_max_and_comparisons_decided_by_bounds():
    i = Var("i")
    ranges = {i: (0, 9)}
    assert simplify(Var.__lt__(i, 10), ranges) == Const(True, "bool")
    assert simplify(i >= 10, ranges) == Const(False, "bool")
    assert simplify((i * -4 + 40) // 4 > 0, ranges) == Const(True, "bool")
    from aotc.ir.expr import maximum, minimum

    assert simplify(minimum(i, 16), ranges) == i
    assert simplify(maximum(i, 0), ranges) == i


def test_bounds_interval_arithmetic():
    i, j = Var("i"), Var("j")
    ranges = {i: (0, 3), j: (0, 15)}
    assert bounds(i * 16 + j, ranges) == (0, 63)
    assert bounds((i * 16 + j) // 8, ranges) == (0, 7)
    assert bounds(j % 4, ranges) == (0, 3)
    assert bounds(i - j, ranges) == (-15, 3)


def test_walk_distinct_visits_a_shared_node_once():
    x, y = Var("x"), Var("y")
    shared = x * 3 + y
    e = shared * shared + shared
    assert sum(n is shared for n in walk(e)) == 3
    assert sum(n is shared for n in walk_distinct(e)) == 1
    assert free_vars(e) == {x, y}


def test_read_tensors_lists_each_tensor_once_in_first_read_order():
    a, b = placeholder((4,), "float32", name="a"), placeholder((4,), "float32", name="b")
    c = compute((4,), lambda i: b[i] * a[i] + b[3 - i], name="c")
    assert read_tensors(c) == (b, a)
    assert read_tensors(c) is read_tensors(c)
