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


def _paths(tree):
    return {tuple(tree.token_ids[a] for a in tree.ancestors(i)) for i in range(tree.size)}


def test_the_tree_holds_every_fork_of_the_matched_suffix():
    from localspec.proposers.ngram import continuation_tree

    # [1, 2, 3] was followed by 4 9 …, by 5 6 … and, most recently, by 4 7 …
    ctx = np.array([1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 1, 2, 3, 4, 7, 1, 2, 3])
    tree = continuation_tree(ctx, 8, 1, 4)
    assert tree.size == 8 and tree.children[0] == [0, 1]  # the root's children: 4 (two occurrences) before 5
    assert tree.token_ids[:2] == [4, 5]
    paths = _paths(tree)
    assert {(4,), (5,), (4, 7), (5, 6), (4, 7, 1)} <= paths  # the recent fork outranks the old one at equal share
    assert all(p[:-1] in paths for p in paths if len(p) > 1)  # closed under ancestors
    chain = tuple(find_continuation(ctx, 3, 1, 4))
    assert chain in paths  # the chain proposal is one of its branches


def test_the_tree_is_one_branch_where_the_text_repeats_one_way_and_none_without_a_match():
    from localspec.proposers.ngram import continuation_tree

    ctx = np.array([7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 7, 8])
    tree = continuation_tree(ctx, 5, 1, 3)
    assert tree.token_ids == [9, 10, 11, 12, 13] and tree.parents == [-1, 0, 1, 2, 3]
    assert continuation_tree(np.array([1, 2, 3, 4]), 8, 1, 3) is None
    assert continuation_tree(ctx, 0, 1, 3) is None


def test_greedy_ngram_trees_equal_plain_decoding(tiny_models):
    from localspec.config import SamplingParams, SpecConfig
    from localspec.engine.loop import Engine
    from localspec.proposers.ngram import NgramProposer

    target, _ = tiny_models
    prompt = [5, 6, 7, 8, 9, 5, 6, 7, 8, 11, 5, 6, 7, 30, 5, 6, 7]
    sampling = SamplingParams(temperature=0.0, max_new_tokens=40)
    runs = {}
    for nodes in (0, 6):
        events = list(
            Engine(target, set()).generate(
                prompt, sampling, SpecConfig(proposer="ngram", tree_nodes=nodes), NgramProposer()
            )
        )
        runs[nodes] = ([t.token_id for e in events for t in e.tokens], events)
    plain = [
        t.token_id
        for e in Engine(target, set()).generate(prompt, sampling, SpecConfig(proposer="none"))
        for t in e.tokens
    ]
    assert runs[0][0] == plain and runs[6][0] == plain
    tree_events = runs[6][1]
    assert max(e.propose_token_num for e in tree_events) > 1 and tree_events[-1].stats.drafted > 0


def test_occurrences_are_every_window_that_matches_the_suffix():
    """The search checks only the positions where the last token occurs earlier; it finds exactly the windows a full
    scan of the context finds (the suffix itself excluded), oldest first, on random contexts of few and many
    distinct tokens."""
    from localspec.proposers.ngram import last_token_ends, occurrences

    rng = np.random.default_rng(7)
    for trial in range(400):
        length, alphabet = int(rng.integers(1, 60)), int(rng.integers(1, 6 if trial % 2 else 50))
        context = rng.integers(0, alphabet, size=length).astype(np.int64)
        ends = last_token_ends(context)
        for n in range(0, 7):
            scan = [j for j in range(0, length - n) if n > 0 and np.array_equal(context[j : j + n], context[-n:])]
            expected = scan if 0 < n < length else []
            assert occurrences(context, n).tolist() == expected, (context.tolist(), n)
            assert occurrences(context, n, ends).tolist() == expected
