"""Pure shard-tree logic: sums, folding, visible lines, reveal, search."""

from __future__ import annotations

import msgspec

from shardtop.read.run_fold import fold
from shardtop.read.shard_model import Fold, ShardModel, fold_children, subtree_sums
from shardtop.read.tree_lines import (
    default_expanded,
    iter_lines_from,
    line_of,
    lines_below,
    oom_marks,
    parent_line,
    subtree_end,
    translate_expanded,
    visible_lines,
)
from shardtop.rundir.event_files import read_all
from shardtop.rundir.events import Shards, Tree, Unit
from tests.support.recorded import recorded_run


def recorded_model(name: str) -> ShardModel:
    """The shard model of a recorded run, as the run view builds it."""
    events, _skipped = read_all(recorded_run(name) / "events")
    state = fold(events)
    assert state.tree is not None
    shards = {r.rank: r.shards for r in state.ranks.values() if r.shards is not None}
    return ShardModel.build(state.tree, shards, paths=state.paths)


def story2() -> ShardModel:
    """Story 2 on the H200: 18 000 Linear(512, 512) in model.net, held whole on cpu at set-up."""
    return recorded_model("h200/zero3-linear")


def six_ranks() -> ShardModel:
    """Story 2 on 6 CPU ranks: 96 Linear in net, each partitioned over the 6 ranks."""
    return recorded_model("cpu-6ranks/zero3-linear")


def shards_for(tree: Tree, rank: int, divide: int = 1) -> Shards:
    n = len(tree.names)
    return Shards(
        tree_id=tree.tree_id,
        engine="zero3",
        stage="engine",
        devices=[f"cuda:{rank}"],
        states=["partitioned"],
        bytes=[b // divide for b in tree.bytes],
        device=[0 if p else -1 for p in tree.params],
        state=[0 if p else -1 for p in tree.params],
        unit=[-1] * n,
        units=[Unit(module=1, kind="zero3", numel=100, local_numel=50)],
        rank=rank,
    )


def test_subtree_sums_follow_parents() -> None:
    assert subtree_sums([1, 2, 3, 4], [-1, 0, 1, 0]) == [10, 5, 3, 4]


def test_repeated_siblings_fold_when_type_and_size_match() -> None:
    kids = [1, 2, 3, 4, 5, 6]
    types = [0, 1, 1, 1, 1, 2, 1]
    params = [0, 5, 5, 5, 5, 5, 5]
    assert fold_children(0, kids, types, params, fold_min=4) == (Fold(0, 0, 4), 5, 6)
    assert fold_children(0, kids, types, params, fold_min=5) == (1, 2, 3, 4, 5, 6)
    params_differ = [0, 5, 5, 6, 5, 5, 5]
    assert fold_children(0, kids, types, params_differ, fold_min=4) == (1, 2, 3, 4, 5, 6)


def test_story2_folds_18000_linear_into_one_line() -> None:
    model = story2()
    lines = visible_lines(model, default_expanded(model))
    assert [model.paths[ln.node] if isinstance(ln.node, int) else model.fold_label(ln.node) for ln in lines] == [
        "",
        "model",
        "model.net",
        "0 … 17999",
    ]
    fold = lines[3].node
    assert isinstance(fold, Fold) and fold.count == 18000
    per = 512 * 512 + 512
    assert model.node_params(fold) == 18000 * per
    assert model.node_bytes(fold, 0) == 18000 * per * 4, "one rank, fp32, whole"
    assert model.node_bytes(0, 0) == model.node_bytes(fold, 0)
    opened = visible_lines(model, default_expanded(model) | {fold})
    assert len(opened) == 4 + 18000
    assert opened[4].guide == "      ├─" and opened[-1].guide == "      └─"


def test_lines_below_and_subtree_end_splice_like_a_rebuild() -> None:
    model = six_ranks()
    expanded = default_expanded(model)
    lines = visible_lines(model, expanded)
    assert len(lines) == 3, "model, net, 96 × Linear"
    expanded.add(lines[2].node)
    opened_fold = visible_lines(model, expanded)[2]
    spliced = lines[:2] + [opened_fold] + lines_below(model, opened_fold, expanded)
    assert spliced == visible_lines(model, expanded)
    assert subtree_end(spliced, 1) == len(spliced)
    assert subtree_end(spliced, 2) == len(spliced)
    assert subtree_end(spliced, 3) == 4


def test_a_line_finds_its_parent_line_and_a_module_its_line() -> None:
    tree = Tree(  # model -> a -> (a.x -> a.x.deep), b
        tree_id=0,
        names=["", "a", "x", "deep", "b"],
        parents=[-1, 0, 1, 2, 0],
        types=[0, 0, 1, 1, 1],
        type_names=["Sequential", "Linear"],
        params=[0, 0, 0, 10, 20],
        bytes=[0, 0, 0, 40, 80],
    )
    model = ShardModel.build(tree, {})
    lines = visible_lines(model, {0, 1})
    assert [line.node for line in lines] == [0, 1, 2, 4]
    assert [parent_line(lines, i) for i in range(len(lines))] == [-1, 0, 1, 0]
    assert [line_of(lines, row) for row in (0, 2, 4)] == [0, 2, 3]
    assert line_of(lines, 3) == 0, "a module inside a closed node has no line"


def test_reveal_opens_ancestors_and_the_fold_holding_the_module() -> None:
    model = story2()
    row = model.row_of("model.net.15330")
    assert row is not None
    opened = model.reveal(row)
    fold = model.fold_containing(row)
    assert fold is not None and fold in opened and {0, 1, 2} <= set(opened)
    lines = visible_lines(model, set(opened))
    assert any(line.node == row for line in lines)
    assert oom_marks(model, "model.net.15330") == frozenset([row, 0, 1, 2, fold])
    assert oom_marks(model, "no.such.module") == frozenset()


def test_search_is_case_insensitive_on_paths() -> None:
    model = six_ranks()
    assert [model.paths[r] for r in model.search("NET.2")] == ["net.2", *(f"net.{i}" for i in range(20, 30))]
    assert model.search("  ") == []


def test_rank_cells_and_units_of_six_ranks() -> None:
    model = six_ranks()
    assert model.ranks == (0, 1, 2, 3, 4, 5)
    row = model.row_of("net.3")
    assert row is not None
    cells = model.rank_cells(row)
    assert [(c.rank, c.device, c.state) for c in cells] == [(r, "cpu", "sharded") for r in range(6)]
    full = model.node_full_bytes(row)
    assert all(abs(c.own_bytes - full / 6) < full / 1000 for c in cells), "1/6 each, give or take padding"
    assert 0 in model.unit_roots and model.unit_roots[0].kind == "zero3"
    placed = model.placement(0)
    assert (placed.state, placed.device) == ("sharded", "cpu")


def test_shards_of_another_tree_or_length_are_ignored() -> None:
    tree = story2().tree
    stale = msgspec.structs.replace(shards_for(tree, 1), tree_id=7)
    short = shards_for(tree, 2)
    short = msgspec.structs.replace(short, bytes=short.bytes[:-1])
    model = ShardModel.build(tree, {0: shards_for(tree, 0), 1: stale, 2: short})
    assert model.ranks == (0,)


def test_ranks_on_their_own_gpu_hold_a_module_on_cuda() -> None:
    tree = six_ranks().tree
    model = ShardModel.build(tree, {0: shards_for(tree, 0), 1: shards_for(tree, 1)})
    assert model.placement(0).device == "cuda", "cuda:0 on rank 0, cuda:1 on rank 1"
    alone = ShardModel.build(tree, {0: shards_for(tree, 0)})
    assert alone.placement(0).device == "cuda:0"


def test_expanded_survives_a_new_tree_by_path() -> None:
    old = six_ranks()
    fold = old.fold_containing(old.row_of("net.4") or 0)
    assert fold is not None
    new = recorded_model("cpu-6ranks/zero3-linear-fixed")  # the same model, another run: other Tree objects
    assert new.tree is not old.tree
    kept = translate_expanded(old, new, {0, 1, fold})
    assert kept == {0, new.row_of("net"), new.fold_containing(new.row_of("net.4") or 0)}
    assert translate_expanded(old, story2(), {1}) == set(), "net is model.net there: not the same module"


def test_100k_sibling_modules_show_as_one_folded_row() -> None:
    """What keeps a 100 000-module model's tree quick (``bench/bench_costs.py`` times it): repeated siblings
    fold into one row, and only the rows shown are lines."""
    tree = Tree(
        tree_id=0,
        names=["", *map(str, range(99_999))],
        parents=[-1, *([0] * 99_999)],
        types=[0, *([1] * 99_999)],
        type_names=["Sequential", "Linear"],
        params=[0, *([10] * 99_999)],
        bytes=[0, *([40] * 99_999)],
    )
    model = ShardModel.build(tree, {0: shards_for(tree, 0), 1: shards_for(tree, 1)})
    lines = visible_lines(model, default_expanded(model))
    assert len(lines) == 2
    siblings = model.fold_containing(1)
    assert siblings is not None and len(model.members(siblings)) == 99_999


def test_each_kind_of_bytes_sums_per_module_and_rank() -> None:
    """fsdp-auto-wrap on an H200 after its steps: each module's own gradient, optimizer and activation
    bytes (the probe's lists) summed over its subtree, as the rank columns show them; total adds them up."""
    model = recorded_model("h200-split/fsdp-auto-wrap")
    s = model.shards[0]
    assert s.grad_bytes is not None and s.optim_bytes is not None and s.act_bytes is not None
    assert model.node_figure(0, 0, "params") == sum(s.bytes) == 4 * model.node_params(0), "fp32, replicated"
    assert model.node_figure(0, 0, "grads") == sum(s.grad_bytes) == sum(s.bytes)
    assert model.node_figure(0, 0, "optimizer") == sum(s.optim_bytes) > 0
    assert model.node_figure(0, 0, "activations") == sum(s.act_bytes) > 0
    assert model.node_figure(0, 0, "total") == sum(s.bytes) + sum(s.grad_bytes) + sum(s.optim_bytes) + sum(s.act_bytes)
    conv1 = model.row_of("conv1")
    assert conv1 is not None and model.node_figure(conv1, 0, "grads") == s.grad_bytes[conv1]
    fold_ = next(n for entries in model.entries.values() for n in entries if isinstance(n, Fold))
    members = model.members(fold_)
    assert model.node_figure(fold_, 0, "activations") == sum(
        model.node_figure(m, 0, "activations") or 0 for m in members
    )


def test_a_kind_no_rank_reported_reads_none_not_zero() -> None:
    """zero3-linear-fixed on an H200: the OOM came at set-up, before any gradient existed."""
    model = recorded_model("h200-split/zero3-linear-fixed")
    assert model.shards[0].grad_bytes is None
    assert model.node_figure(0, 0, "grads") is None and model.node_figure(0, 0, "activations") is None
    assert model.node_figure(0, 0, "total") == model.node_figure(0, 0, "params"), "the total of what is known"
    assert model.node_figure(0, 7, "grads") is None, "a rank the run does not have"


def test_lines_from_a_sibling_on_are_the_whole_walks_lines_from_there() -> None:
    """Story 2's culprit is the 15 331st of 18 000 Linear: the first frame walks from a few siblings
    before it, and draws the lines the walk from the top would have drawn from there on."""
    model = recorded_model("h200/zero3-linear")
    culprit = model.row_of("model.net.15330")
    assert culprit is not None
    way = [*model.reveal(culprit), culprit]
    expanded = {*default_expanded(model), *way[:-1]}
    whole = visible_lines(model, expanded)
    parent = way[-2]
    kids = model.kids_of(parent)
    for start in (0, 1, kids.index(culprit) - 18, kids.index(culprit), len(kids) - 1):
        first = next(i for i, line in enumerate(whole) if line.node == kids[start])
        assert list(iter_lines_from(model, expanded, way[:-1], start)) == whole[first:]
