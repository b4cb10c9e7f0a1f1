"""A draft tree's records: nodes from SGLang's top_scores_index and parent_list, each node's draft top-k from
the draft step and branch that proposed it, the accepted path from the tokens SGLang compacts to the front."""

from __future__ import annotations

from types import SimpleNamespace

from draftscope_tracer.stats import DraftSteps
from draftscope_tracer.transport import records

# topk 2, 3 draft steps: candidates 0-1 from the seed, 2-5 from draft step 0 (group 1 + branch), 6-9 from step 1.
# parent_list: [-1, 0, 1] (the seed's candidates are step 0's branches), then step 1's branches: candidates 2, 5.
PARENTS = [-1, 0, 1, 2, 5]


def test_nodes_hang_under_the_node_holding_their_parent_candidate():
    # nodes: 1 = c0 (seed), 2 = c1 (seed), 3 = c2 (step 0, branch 0: under c0), 4 = c5 (step 0, branch 1: under
    # c1), 5 = c6 (step 1, branch 0: under c2)
    shape = records.draft_tree([0, 1, 2, 5, 6], PARENTS, 2)
    assert shape == [(0, None), (0, None), (1, (0, 0)), (2, (0, 1)), (3, (1, 0))]


def test_the_accepted_path_follows_the_target_tokens_down_the_tree():
    parents = [0, 0, 1, 2, 3]
    drafted = [10, 11, 12, 13, 14]
    # the target took 10 then 12 (its tokens on the accepted path come first), then its bonus 99
    assert records.accepted_path(parents, drafted, [10, 12, 99, 0, 0, 0], 3) == {1, 3}
    assert records.accepted_path(parents, drafted, [11, 13, 14, 0, 0, 0], 3) == {2, 4}
    assert records.accepted_path(parents, drafted, [42, 0, 0, 0, 0, 0], 1) == set()


class _Read:
    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


def test_a_tree_step_record_has_per_node_draft_and_target_top_k_parents_and_flags():
    N = 6
    chosen = [0, 1, 2, 5, 6]
    positions = [[[(100 + 10 * s + r, 0.5)] for r in range(4)] for s in range(2)]  # 2 steps x (2 requests x 2)
    steps = DraftSteps(positions, [[9] * 10, chosen + PARENTS], 2)
    seed = SimpleNamespace(rows=[SimpleNamespace(topk=[(7, 0.9)])])
    target = SimpleNamespace(rows=[SimpleNamespace(topk=[(200 + r, 0.8)]) for r in range(2 * N)])
    # request "a" is the second of the read (row 1): verified token 5, drafts 10..14, accepted 10 and 12
    # (records.step_tokens' layout: nodes of z then a, target tokens of z then a, sequence lengths, accept lengths)
    ints = _Read([0] * N + [5, 10, 11, 12, 13, 14] + [0] * N + [10, 12, 99, 0, 0, 0] + [3, 7] + [1, 3])
    rows = [(0, "z", 0), (1, "a", 4)]
    drafts = {"a": ((_Read(seed), 0, False), (_Read(steps), 1, False))}
    out = records.verify(ints, _Read(target), rows, records.VerifyShape(N, 0, None, None, True), 1.0, drafts, None)
    z, a = out["steps"]
    assert z["accept_flags"] == [] and "tree_parents" not in z and "target_topk" not in z  # no shape read
    assert a["tree_parents"] == [0, 0, 1, 2, 3]
    assert a["accept_flags"] == [True, False, True, False, False]
    assert a["bonus_token"] == 99 and a["accept_len"] == 3
    # depth-1 nodes: the seed's top-k; node 3 (c2): step 0, branch 0 of row 1 -> positions[0][2];
    # node 4 (c5): step 0 branch 1 -> positions[0][3]; node 5 (c6): step 1 branch 0 -> positions[1][2]
    assert [d[0][0] for d in a["draft_topk"]] == [7, 7, 102, 103, 112]
    # the target's distribution over each node's token: at its parent (node 0 = row N of request a)
    assert [t[0][0] for t in a["target_topk"]] == [200 + N, 200 + N, 201 + N, 202 + N, 203 + N]
