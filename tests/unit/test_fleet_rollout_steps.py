"""A rollout's view of serving groups and of the router's fleet: a group read from `corral up`'s
control API, and which members PRECHECK finds unrouted (by engine URL, else by supervisor URL)."""

from __future__ import annotations

from corral.bundle_spec import BundleSpec
from corral.contracts.router import FleetEndpoint, SupervisorLink
from corral.contracts.up import GroupMember, ServingGroup
from corral.fleet.rollout.base import RolloutBase
from corral.fleet.rollout.steps import Group, RolloutSettings


def _member(name: str, n: int) -> GroupMember:
    return GroupMember(name=name, group="g0", supervisor=f"http://sup{n}", engine=f"http://eng{n}")


def test_a_group_reads_its_bundle_and_members() -> None:
    served = ServingGroup(
        name="g0", bundle=BundleSpec(name="v2").to_json(), members=[_member("e0", 0), _member("e1", 1)]
    )
    group = Group.of(served)
    assert group.bundle == BundleSpec(name="v2")
    assert group.supervisors == ["http://sup0", "http://sup1"]
    assert group.engines == ["http://eng0", "http://eng1"]
    assert Group.of(ServingGroup(name="g1")).bundle is None


def test_unrouted_matches_by_engine_url_or_by_supervisor_url() -> None:
    group = Group("g0", None, [_member("e0", 0), _member("e1", 1), _member("e2", 2)])
    listed = {
        "http://eng0": FleetEndpoint(url="http://eng0", routable=True),
        # listed under another URL (a pod IP), but behind e1's supervisor
        "http://10.0.0.1:8000": FleetEndpoint(
            url="http://10.0.0.1:8000", routable=True, supervisor=SupervisorLink(url="http://sup1")
        ),
        "http://eng2": FleetEndpoint(url="http://eng2", routable=False, why="not ready"),
    }
    assert RolloutBase._unrouted([group], listed) == ["e2"]
    assert RolloutBase._unrouted([group], {}) == ["e0", "e1", "e2"]


def test_batch_is_surge_else_unavailable() -> None:
    assert RolloutSettings().batch == 1
    assert RolloutSettings(max_surge=0, max_unavailable=2).batch == 2
