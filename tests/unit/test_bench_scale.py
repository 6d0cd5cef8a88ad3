"""bench/scale.py on a small network: the measures are sane and the network converges."""

from collections import Counter

import pytest

from bench import scale


def _degrees(edges):
    return Counter(name for edge in edges for name in edge)


def test_topology_is_connected_seeded_and_every_router_has_3_or_4_neighbours():
    edges = scale.random_topology(60, seed=5)
    assert edges == scale.random_topology(60, seed=5)
    assert edges != scale.random_topology(60, seed=6)
    degree = _degrees(edges)
    assert len(degree) == 60 and all(2 <= d <= 4 for d in degree.values())
    assert sum(d >= 3 for d in degree.values()) >= 55, "a ring's routers left at degree 2 are the rare exception"
    reached, frontier = {"r000"}, ["r000"]
    while frontier:
        here = frontier.pop()
        for a, b in edges:
            other = b if a == here else a if b == here else None
            if other is not None and other not in reached:
                reached.add(other)
                frontier.append(other)
    assert len(reached) == 60


@pytest.fixture(scope="module")
def small():
    return scale.run(routers=8, subscribers=500, topics=50, walk=2, messages=8, wave=200, seed=3, log=lambda *_: None)


def test_storms_flood_each_announcement_once_over_every_link_but_the_one_it_came_by(small):
    """Every router floods an announcement on to all its neighbours but the one it came
    from, the first time it sees it: 2 x links - (routers - 1) messages per announcement."""
    per_announcement = 2 * small["links"] - (small["routers"] - 1)
    assert small["attach"].traffic.messages["sub+"] == 500 * per_announcement
    assert small["detach"].traffic.messages["sub-"] == small["detached"] * per_announcement == 50 * per_announcement
    # every receipt of an attach, duplicates too, is confirmed along the best path to its origin
    assert small["attach"].traffic.messages["sub-ack"] >= 500 * (small["routers"] - 1)
    assert small["attach"].traffic.transfer_bytes > 100 * small["attach"].traffic.total_messages()


def test_every_router_holds_every_other_routers_subscribers_at_a_plausible_size(small):
    for name, memory in small["memory"].items():
        remote = 500 - memory["local"]
        assert 200 < memory["table"] / remote < 5000, (name, memory)
        assert memory["announcer"] > 0
        # Storms leave no flood stamps behind: the table's versions recognise repeats.
        assert memory["flooded"] < 1000, (name, memory["flooded"])


def test_a_router_dies_routes_agree_again_and_every_delivery_in_flight_finishes(small):
    kill = small["kill"]
    assert kill.agreed_after is not None and 1 <= kill.agreed_after <= kill.rounds
    assert kill.traffic.messages["ls"] > 0
    in_flight = small["in_flight"]
    assert in_flight["copies"] > in_flight["answered_before"] > 0
    assert in_flight["resumed"] > 0, "the dead router had subscribers to the topics in flight"
    assert small["finished"] == small["accepted"] == 8
    assert small["missing"] == 0 and small["duplicates"] == 0, "every subscriber accepted each delivery once"


def test_agreement_sees_a_router_that_has_not_heard_of_a_death():
    net = scale.ScaleNet(scale.router_names(5), scale.random_topology(5, seed=1))
    assert net.routes_agree() == []
    net.kill("r002")
    assert net.routes_agree(), "the neighbours' new link states are still on the wire"
    net.settle()
    assert net.routes_agree() == []
    assert net.membership_agrees() == []
