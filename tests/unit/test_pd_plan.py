"""The P/D rollout planner: the order of moves and the refusals (fleet/rollout/pd_plan.py)."""

from __future__ import annotations

import pytest

from corral.fleet.rollout.pd_plan import (
    Capacity,
    PairLimits,
    PlanGroup,
    PlanRefused,
    has_roles,
    plan_waves,
)

OLD, NEW = "pair-v1", "pair-v2"


def fleet(prefill: int, decode: int, pairing: str = OLD) -> list[PlanGroup]:
    groups = [PlanGroup(f"p{i}", "prefill", 1, pairing) for i in range(prefill)]
    return groups + [PlanGroup(f"d{i}", "decode", 1, pairing) for i in range(decode)]


def test_capacity_counts_only_engines_with_a_compatible_partner() -> None:
    cap = Capacity.of([("prefill", OLD, 2), ("decode", OLD, 1), ("decode", NEW, 3), ("prefill", None, 1)])
    assert (cap.prefill, cap.decode, cap.pairs) == (2, 1, (OLD,))
    assert Capacity.of([("prefill", None, 1), ("decode", None, 1)]).pairs == ()  # unknown pairs nothing
    assert Capacity.of([("both", NEW, 1)]).pairs == (NEW,)
    assert Capacity.of([("prefill", OLD, 1), ("decode", NEW, 1)]).shortfall(PairLimits()) == (
        "no complete compatible pair routable"
    )


def test_a_changed_identity_moves_prefill_and_decode_together() -> None:
    waves = plan_waves(fleet(2, 2), NEW, 1, surge=True, limits=PairLimits())
    assert [w.groups for w in waves] == [("p0", "d0"), ("p1", "d1")]
    assert all(w.together for w in waves)
    # after the first wave the new pair and the old pair are both complete
    assert waves[0].lowest.pairs == (OLD, NEW) and waves[0].lowest.decode == 2
    assert waves[1].lowest.pairs == (NEW,)


def test_an_unknown_target_identity_is_taken_to_differ() -> None:
    waves = plan_waves(fleet(2, 2), None, 1, surge=True, limits=PairLimits())
    assert [w.groups for w in waves] == [("p0", "d0"), ("p1", "d1")]


def test_the_same_identity_moves_each_role_on_its_own() -> None:
    waves = plan_waves(fleet(2, 3), OLD, 1, surge=True, limits=PairLimits())
    assert [w.groups for w in waves] == [("p0",), ("d0",), ("p1",), ("d1",), ("d2",)]
    assert not any(w.together for w in waves)
    assert all(w.lowest.prefill == 2 and w.lowest.decode == 3 for w in waves)


def test_groups_already_on_the_target_stay() -> None:
    groups = [*fleet(1, 1, NEW), PlanGroup("p9", "prefill", 1, OLD), PlanGroup("d9", "decode", 1, OLD)]
    groups = [PlanGroup(g.name, g.role, g.engines, g.pairing, moves=g.pairing == OLD) for g in groups]
    assert [w.groups for w in plan_waves(groups, NEW, 1, True, PairLimits())] == [("p9", "d9")]


def test_without_surge_a_lone_pair_is_refused() -> None:
    with pytest.raises(
        PlanRefused, match=r"step 1 \(moving p0, d0\) would leave no complete compatible pair"
    ):
        plan_waves(fleet(1, 1), NEW, 1, surge=False, limits=PairLimits())


def test_max_unavailable_that_leaves_no_prefill_is_refused_even_with_the_same_identity() -> None:
    with pytest.raises(
        PlanRefused, match=r"moving p0, p1\) would leave no complete compatible pair.*lower --max-unavailable"
    ):
        plan_waves(fleet(2, 2), OLD, 2, surge=False, limits=PairLimits())
    # one at a time keeps a pair (and one engine of each role) at every step
    waves = plan_waves(fleet(2, 2), OLD, 1, surge=False, limits=PairLimits())
    assert [w.lowest.decode for w in waves] == [2, 1, 2, 1]


def test_minimums_above_what_a_wave_keeps_are_refused_with_what_to_change() -> None:
    # 1 prefill, 3 decode, identity changes: after moving the prefill the old decode engines pair with
    # nothing, so only the one new decode engine is usable
    with pytest.raises(PlanRefused, match=r"1 usable decode engine.*below --min-decode 2.*raise --max-surge"):
        plan_waves(fleet(1, 3), NEW, 1, surge=True, limits=PairLimits(min_decode=2))
    waves = plan_waves(fleet(1, 3), NEW, 3, surge=True, limits=PairLimits(min_decode=2))
    assert [w.groups for w in waves] == [("p0", "d0", "d1", "d2")]


def test_a_fleet_that_starts_short_is_refused() -> None:
    with pytest.raises(PlanRefused, match="starts short: no complete compatible pair"):
        plan_waves(
            [PlanGroup("p0", "prefill", 1, OLD), PlanGroup("d0", "decode", 1, NEW)],
            NEW,
            1,
            True,
            PairLimits(),
        )


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="role 'prefil'"):
        PlanGroup("g0", "prefil", 1, OLD)
    with pytest.raises(ValueError, match="min-prefill"):
        PairLimits(min_prefill=-1)
    assert has_roles(["both", "decode"]) and not has_roles(["both"])
