"""Pure tensor functions of the tree: masks, positions, acceptance, renumbering."""

import numpy as np
import torch

from sage_engine.core.tree import DraftTree, accept_greedy, additive_mask, verify_allowed


def small_tree():
    #        root
    #       /    \
    #     0:a    1:b
    #    /   \      \
    #  2:c   3:d    4:e
    #   |
    #  5:f
    t = DraftTree()
    for tok, parent in [(10, -1), (11, -1), (12, 0), (13, 0), (14, 1), (15, 2)]:
        t.add(tok, parent, 0.5)
    return t


def ancestor_matrix(parents):
    return verify_allowed(parents)[1:, 1:]


def test_a_nodes_pattern_marks_self_and_ancestors_only():
    anc = ancestor_matrix(small_tree().parents)
    assert anc[5].nonzero()[0].tolist() == [0, 2, 5]
    assert anc[4].nonzero()[0].tolist() == [1, 4]
    assert anc[1].nonzero()[0].tolist() == [1]
    assert anc.sum() == 1 + 1 + 2 + 2 + 2 + 3


def test_verify_pattern_root_visible_to_all_and_siblings_hidden():
    allowed = verify_allowed(small_tree().parents)
    assert allowed.shape == (7, 7)
    assert allowed[:, 0].all()
    assert not allowed[0, 1:].any()  # the root sees only itself in the tree region
    assert not allowed[1 + 3, 1 + 2]  # siblings c, d do not see each other
    assert allowed[1 + 5, [0, 1, 3, 6]].all() and allowed[1 + 5].sum() == 4


def test_additive_mask_is_zero_where_allowed_and_min_elsewhere():
    allowed = verify_allowed(small_tree().parents)
    m = additive_mask(allowed, past_len=5, dtype=torch.float32, device="cpu")
    assert m.shape == (1, 1, 7, 12)
    assert (m[0, 0, :, :5] == 0).all()  # the cached prefix is always visible
    region = m[0, 0, :, 5:]
    assert torch.equal(region == 0, torch.from_numpy(allowed))
    assert (region[~torch.from_numpy(allowed)] == torch.finfo(torch.float32).min).all()


def test_accept_greedy_follows_target_argmax_and_returns_bonus():
    t = small_tree()
    # target: after root -> 10 (node 0), after node 0 -> 12 (node 2), after node 2 -> 15 (node 5), after node 5 -> 99
    nxt = [10, 0, 0, 12, 0, 0, 0]
    nxt[1 + 0], nxt[1 + 2], nxt[1 + 5] = 12, 15, 99
    path, bonus = accept_greedy(t, nxt)
    assert path == [0, 2, 5] and bonus == 99


def test_accept_greedy_rejects_at_root_gives_target_token():
    path, bonus = accept_greedy(small_tree(), [77, 0, 0, 0, 0, 0, 0])
    assert path == [] and bonus == 77


def test_accept_greedy_stops_at_first_mismatch():
    nxt = [11, 0, 42, 0, 0, 0, 0]  # root -> 11 (node 1); after node 1 the target wants 42, node 4 has 14
    path, bonus = accept_greedy(small_tree(), nxt)
    assert path == [1] and bonus == 42


def test_subtree_renumbers_and_refuses_orphans():
    t = small_tree()
    sub = t.subtree([5, 2, 0, 1])
    assert sub.tokens == [10, 11, 12, 15]
    assert sub.parents == [-1, -1, 0, 2]
    try:
        t.subtree([5, 0])
    except ValueError:
        pass
    else:
        raise AssertionError("orphan node accepted")


def test_from_paths_builds_static_tree():
    t = DraftTree.from_paths([(0,), (1,), (0, 0), (0, 1), (0, 0, 0)])
    assert t.depths == [1, 1, 2, 2, 3]
    assert t.parents == [-1, -1, 0, 0, 2]
    assert np.array_equal(ancestor_matrix(t.parents)[4], [True, False, True, False, True])


def test_columns_are_the_tree_as_arrays_and_follow_a_grown_tree():
    t = small_tree()
    tokens, parents = t.columns()
    assert tokens.tolist() == t.tokens and parents.tolist() == t.parents and tokens.dtype == np.int64
    assert t.columns()[0] is tokens  # kept while the tree is unchanged
    t.add(16, 5, 0.5)
    tokens, parents = t.columns()
    assert tokens.tolist() == t.tokens and parents.tolist()[-1] == 5
    made = DraftTree([1, 2], [-1, 0], arrays=(np.array([1, 2]), np.array([-1, 0])))
    assert made.columns() is made.arrays  # the compiled draft's own arrays are read as they are
