"""The pure parts of sweeps: search spaces (checked, naming the parameter), the samplers
(grid in order, random and TPE seeded and inside the space), and ASHA's rungs and decisions."""

from __future__ import annotations

import math

import pytest

from tuneforge.domain.errors import ApiError
from tuneforge.sweeps import asha as asha_module
from tuneforge.sweeps import space as sweep_space
from tuneforge.sweeps.asha import Asha

SPACE = {"learning_rate": {"type": "loguniform", "low": 1e-4, "high": 1e-1},
         "batch_size": {"type": "choice", "values": [4, 8]},
         "training_type.rank": {"type": "int", "low": 4, "high": 32, "log": True}}


def test_a_space_is_parsed_and_bad_parameters_are_named():
    dims = sweep_space.parse_space(SPACE)
    assert [(d.name, d.kind, d.log) for d in dims] == [("learning_rate", "loguniform", True),
                                                      ("batch_size", "choice", False),
                                                      ("training_type.rank", "int", True)]
    for bad, param in (({"lr": {"type": "normal"}}, "search_space.lr.type"),
                       ({"lr": {"type": "uniform", "low": 2, "high": 1}}, "search_space.lr"),
                       ({"lr": {"type": "loguniform", "low": 0, "high": 1}}, "search_space.lr.low"),
                       ({"lr": {"type": "choice", "values": []}}, "search_space.lr.values"),
                       ({"env.PATH": {"type": "choice", "values": [1]}}, "search_space.env.PATH"),
                       ({"a/b": {"type": "choice", "values": [1]}}, "search_space.a/b")):
        with pytest.raises(ApiError) as refused:
            sweep_space.parse_space(bad)
        assert refused.value.param == param
    with pytest.raises(ApiError):
        sweep_space.check_sampler("grid", dims)  # not all choices


def test_grid_random_and_tpe_points():
    grid = sweep_space.parse_space({"a": {"type": "choice", "values": [1, 2]},
                                    "b": {"type": "choice", "values": ["x", "y", "z"]}})
    assert sweep_space.grid_size(grid) == 6
    in_order = [{"a": a, "b": b} for a in (1, 2) for b in ("x", "y", "z")]
    assert [sweep_space.grid_point(grid, i) for i in range(6)] == in_order
    shuffled = [sweep_space.grid_point(grid, i, seed=3) for i in range(6)]
    assert sorted(shuffled, key=in_order.index) == in_order and shuffled != in_order  # every point, once
    assert shuffled == [sweep_space.grid_point(grid, i, seed=3) for i in range(6)]
    dims = sweep_space.parse_space(SPACE)
    points = [sweep_space.random_point(dims, seed=5, index=i) for i in range(50)]
    assert points == [sweep_space.random_point(dims, seed=5, index=i) for i in range(50)]  # repeatable
    assert all(1e-4 <= p["learning_rate"] <= 1e-1 and p["batch_size"] in (4, 8)
               and 4 <= p["training_type.rank"] <= 32 and isinstance(p["training_type.rank"], int) for p in points)
    # log scale: about as many draws below 1e-2.5 as above
    below = sum(p["learning_rate"] < 10 ** -2.5 for p in points)
    assert 15 <= below <= 35
    finished = [(p, math.log10(p["learning_rate"]) ** 2) for p in points[:10]]  # best near 1
    suggested = sweep_space.tpe_point(dims, seed=5, index=10, minimize=True, finished=finished)
    assert set(suggested) == {d.name for d in dims} and 1e-4 <= suggested["learning_rate"] <= 1e-1
    assert suggested == sweep_space.tpe_point(dims, seed=5, index=10, minimize=True, finished=finished)


def test_a_trial_body_sets_the_parameters_in_place():
    body = {"model": "m", "training_file": "f", "method": {"type": "supervised", "supervised": {
        "hyperparameters": {"n_epochs": 3}}}}
    trial = sweep_space.apply(body, "supervised", {"learning_rate": 0.01, "training_type.rank": 8})
    assert trial["method"]["supervised"]["hyperparameters"] == {"n_epochs": 3, "learning_rate": 0.01}
    assert trial["training_type"] == {"rank": 8}
    assert body["method"]["supervised"]["hyperparameters"] == {"n_epochs": 3}  # the base is untouched
    assert sweep_space.apply({"model": "m"}, "dpo", {"beta": 0.2})["method"] == {
        "type": "dpo", "dpo": {"hyperparameters": {"beta": 0.2}}}


def test_asha_rungs_and_decisions():
    asha = Asha(min_epochs=1, eta=2)
    assert asha.rungs(8) == [1, 2, 4] and asha.rungs(1) == [] and Asha(eta=3).rungs(10) == [1, 3, 9]
    assert asha.keeps(0.5, [0.5])  # the first at a rung goes on
    assert asha.keeps(0.4, [0.5, 0.4]) and not asha.keeps(0.6, [0.5, 0.6])
    assert asha.keeps(0.5, [0.4, 0.6, 0.5])  # best ceil(3/2) = 2 go on
    assert not Asha(eta=2, minimize=False).keeps(0.4, [0.5, 0.4])
    # a trial that reached rungs 1 and 2 since it was last looked at: judged at both, stopped at 2
    records = {0: [0.9, 0.3], 1: [0.2]}
    new, goes_on = asha_module.judge(asha, 8, [(1.0, 0.5), (2.0, 0.45)], judged=0, records=records)
    assert new == [(0, 0.5), (1, 0.45)] and goes_on is False
    new, goes_on = asha_module.judge(asha, 8, [(1.0, 0.25)], judged=0, records=records)
    assert new == [(0, 0.25)] and goes_on is True
    assert asha_module.judge(asha, 8, [(0.5, 0.1)], judged=0, records=records) == ([], True)  # no rung yet
