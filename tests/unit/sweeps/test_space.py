"""A sweep's grid is sized by arithmetic and drawn lazily: a 1 KB body naming
16 parameters of 64 choices (2**96 points) costs a few hash rounds per trial, never the grid."""

from __future__ import annotations

import itertools
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuneforge.sweeps import space as sweep_space


def _grid(parameters: int, choices: int) -> list[sweep_space.Dimension]:
    return sweep_space.parse_space({f"p{i}": {"type": "choice", "values": list(range(choices))}
                                    for i in range(parameters)})


@given(st.integers(1, 600), st.integers(0, 2**31))
def test_the_shuffle_is_a_permutation(size: int, seed: int) -> None:
    order = [sweep_space.shuffled_index(i, size, f"grid:{seed}") for i in range(size)]
    assert sorted(order) == list(range(size))


def test_the_shuffle_depends_on_the_seed_only() -> None:
    first = [sweep_space.shuffled_index(i, 1000, "grid:1") for i in range(1000)]
    assert first == [sweep_space.shuffled_index(i, 1000, "grid:1") for i in range(1000)]
    assert first != [sweep_space.shuffled_index(i, 1000, "grid:2") for i in range(1000)]
    assert first != list(range(1000))


def test_unshuffled_points_follow_the_product_order() -> None:
    grid = sweep_space.parse_space({"a": {"type": "choice", "values": [1, 2, 3]},
                                    "b": {"type": "choice", "values": ["x", "y"]},
                                    "c": {"type": "choice", "values": [True, False]}})
    expected = [dict(zip("abc", combo)) for combo in itertools.product([1, 2, 3], ["x", "y"], [True, False])]
    assert [sweep_space.grid_point(grid, i) for i in range(12)] == expected


def test_a_huge_grid_is_sized_and_sampled_without_being_built() -> None:
    grid = _grid(16, 64)
    assert sweep_space.grid_size(grid) == 64**16 == 2**96
    tracemalloc.start()
    try:
        points = [sweep_space.grid_point(grid, index, seed=7) for index in range(100)]
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak_bytes < 1024 * 1024  # 100 trials' parameters, not 2**96 indexes
    assert len({tuple(point.values()) for point in points}) == 100  # distinct combinations
    assert all(set(point.values()) <= set(range(64)) for point in points)


def test_a_point_outside_the_grid_is_refused() -> None:
    grid = _grid(2, 3)
    with pytest.raises(IndexError):
        sweep_space.grid_point(grid, 9, seed=1)
