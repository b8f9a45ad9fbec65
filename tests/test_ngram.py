import numpy as np

from localspec.proposers.ngram import find_continuation


def test_longest_suffix_match_wins():
    ctx = np.array([1, 2, 3, 9, 9, 2, 3, 7, 7, 1, 2, 3])
    # suffix [1,2,3] occurs at 0 → continues with 9, 9
    assert find_continuation(ctx, 2, 1, 3) == [9, 9]
    # with max_n 2, suffix [2,3] most recently occurs at 5 → continues 7, 7, 1
    assert find_continuation(ctx, 3, 1, 2) == [7, 7, 1]


def test_no_match_and_short_context():
    assert find_continuation(np.array([1, 2, 3, 4]), 3, 1, 3) == []
    assert find_continuation(np.array([5]), 3, 1, 3) == []
    assert find_continuation(np.array([5, 5]), 3, 1, 3) == [5]


def test_min_n_is_respected():
    ctx = np.array([4, 8, 1, 2, 8])
    assert find_continuation(ctx, 2, 1, 3) == [1, 2]
    assert find_continuation(ctx, 2, 2, 3) == []
