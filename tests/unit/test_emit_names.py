"""Region name stems are claimed before any code is generated: unique, and none a word-extension of another."""

from __future__ import annotations

from kfuse.emit import claim_stem


def test_repeated_stems_get_numbers():
    claimed: set[str] = set()
    got = [claim_stem(s, claimed) for s in ["linear_relu", "linear_relu", "linear_relu"]]
    assert got == ["linear_relu", "linear_relu_2", "linear_relu_3"]


def test_a_stem_extending_another_by_a_derived_word_is_renamed():
    """`linear`'s derived names (`linear_apply_kernel`, ...) could meet `linear_apply`'s: one of them moves."""
    claimed: set[str] = set()
    first = claim_stem("linear_apply", claimed)
    second = claim_stem("linear", claimed)
    assert first == "linear_apply" and second == "linear_2"


def test_many_layers_terminate_and_stay_unique():
    """An MLP of 40 identical layers (level3's DeepNarrowMLP has 16): every stem distinct."""
    claimed: set[str] = set()
    got = [claim_stem(s, claimed) for s in ["linear_relu"] * 40 + ["linear"] * 5]
    assert len(set(got)) == len(got)


def test_a_stem_extending_another_by_an_op_is_kept():
    """The two forwards of a model with a Dropout: `linear` (train) and `linear_mean_softmax` (eval) define
    different names; the search must not loop (it did, once, on such a pair)."""
    claimed: set[str] = set()
    got = [claim_stem(s, claimed) for s in ["linear", "linear_mean_softmax", "linear_mean_softmax", "linear"]]
    assert got == ["linear", "linear_mean_softmax", "linear_mean_softmax_2", "linear_2"]
