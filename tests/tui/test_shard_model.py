"""Pure shard-tree logic: sums, folding, visible lines, reveal, search."""

from __future__ import annotations

import time

from shardtop.events import Shards, Tree, Unit
from shardtop.tui.shard_model import (
    Fold,
    ShardModel,
    default_expanded,
    fold_children,
    lines_below,
    oom_marks,
    subtree_end,
    subtree_sums,
    translate_expanded,
    visible_lines,
)
from tests.tui.recorded import linear_stack_tree


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


def story2(n_layers: int = 18000) -> ShardModel:
    tree = linear_stack_tree(n_layers)
    return ShardModel.build(tree, {0: shards_for(tree, 0, 2), 1: shards_for(tree, 1, 2)})


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
        "net",
        "0 … 17999",
    ]
    fold = lines[2].node
    assert isinstance(fold, Fold) and fold.count == 18000
    per = 512 * 512 + 512
    assert model.node_params(fold) == 18000 * per
    assert model.node_bytes(fold, 0) == 18000 * per * 4 // 2
    assert model.node_bytes(0, 1) == model.node_bytes(fold, 1)
    opened = visible_lines(model, default_expanded(model) | {fold})
    assert len(opened) == 3 + 18000
    assert opened[3].guide == "    ├─" and opened[-1].guide == "    └─"


def test_lines_below_and_subtree_end_splice_like_a_rebuild() -> None:
    model = story2(10)
    expanded = default_expanded(model)
    lines = visible_lines(model, expanded)
    expanded.add(lines[2].node)
    opened_fold = visible_lines(model, expanded)[2]
    spliced = lines[:2] + [opened_fold] + lines_below(model, opened_fold, expanded)
    assert spliced == visible_lines(model, expanded)
    assert subtree_end(spliced, 1) == len(spliced)
    assert subtree_end(spliced, 2) == len(spliced)
    assert subtree_end(spliced, 3) == 4


def test_reveal_opens_ancestors_and_the_fold_holding_the_module() -> None:
    model = story2()
    row = model.row_of("net.1234")
    assert row is not None
    opened = model.reveal(row)
    fold = model.fold_containing(row)
    assert fold is not None and fold in opened and 0 in opened and 1 in opened
    lines = visible_lines(model, set(opened))
    assert any(line.node == row for line in lines)
    assert oom_marks(model, "net.1234") == frozenset([row, 0, 1, fold])
    assert oom_marks(model, "no.such.module") == frozenset()


def test_search_is_case_insensitive_on_paths() -> None:
    model = story2(30)
    assert [model.paths[r] for r in model.search("NET.2")] == ["net.2", *(f"net.{i}" for i in range(20, 30))]
    assert model.search("  ") == []


def test_rank_cells_and_units() -> None:
    model = story2(8)
    row = model.row_of("net.3")
    assert row is not None
    cells = model.rank_cells(row)
    assert [(c.rank, c.device, c.state) for c in cells] == [(0, "cuda:0", "partitioned"), (1, "cuda:1", "partitioned")]
    assert cells[0].own_bytes == (512 * 512 + 512) * 4 // 2
    assert 1 in model.unit_roots


def test_shards_of_another_tree_or_length_are_ignored() -> None:
    tree = linear_stack_tree(5)
    stale = shards_for(tree, 1)
    stale.tree_id = 7
    short = shards_for(tree, 2)
    short.bytes = short.bytes[:-1]
    model = ShardModel.build(tree, {0: shards_for(tree, 0), 1: stale, 2: short})
    assert model.ranks == (0,)


def test_expanded_survives_a_new_tree_by_path() -> None:
    old = story2(10)
    fold = old.fold_containing(old.row_of("net.4") or 0)
    assert fold is not None
    bigger = story2(12)
    kept = translate_expanded(old, bigger, {0, 1, fold})
    assert kept == {0, 1, bigger.fold_containing(bigger.row_of("net.4") or 0)}


def test_100k_modules_build_and_show_fast() -> None:
    tree = Tree(
        tree_id=0,
        names=["", *map(str, range(99_999))],
        parents=[-1, *([0] * 99_999)],
        types=[0, *([1] * 99_999)],
        type_names=["Sequential", "Linear"],
        params=[0, *([10] * 99_999)],
        bytes=[0, *([40] * 99_999)],
    )
    started = time.perf_counter()
    model = ShardModel.build(tree, {0: shards_for(tree, 0), 1: shards_for(tree, 1)})
    lines = visible_lines(model, default_expanded(model))
    elapsed = time.perf_counter() - started
    assert len(lines) == 2
    assert elapsed < 1.5, f"building a 100k-module model took {elapsed:.2f}s"
