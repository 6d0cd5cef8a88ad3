"""router.core.routing: the link-state database, next hops and splitting by hop."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.core.errors import ProtocolError
from router.core.routing import (
    LinkState,
    LinkStateDatabase,
    Routes,
    Stamp,
    compute_routes,
    split_by_next_hop,
)

INF = float("inf")


def states_of(
    edges: dict[tuple[str, str], int], routers: str | list[str] = "", *, one_sided: dict[tuple[str, str], int] | None = None
) -> list[LinkState]:
    """Link states for an undirected graph: each edge reported by both ends with
    its cost; ``one_sided`` links are reported only by their first router."""
    neighbours: dict[str, dict[str, int]] = {r: {} for r in routers}
    for (a, b), cost in edges.items():
        neighbours.setdefault(a, {})[b] = cost
        neighbours.setdefault(b, {})[a] = cost
    for (a, b), cost in (one_sided or {}).items():
        neighbours.setdefault(a, {})[b] = cost
        neighbours.setdefault(b, {})
    return [LinkState.of(r, 1, f"boot-{r}", 1, peers) for r, peers in sorted(neighbours.items())]


def line(*routers: str, cost: int = 1) -> dict[tuple[str, str], int]:
    return {(a, b): cost for a, b in zip(routers, routers[1:])}


def ring(*routers: str, cost: int = 1) -> dict[tuple[str, str], int]:
    return {**line(*routers, cost=cost), (routers[-1], routers[0]): cost}


def follow(all_routes: dict[str, Routes], source: str, dest: str) -> list[str]:
    """The path a message takes hop by hop, each router using its own routes."""
    path = [source]
    while path[-1] != dest:
        path.append(all_routes[path[-1]].next_hop[dest])
        assert len(path) <= len(all_routes), f"loop: {path}"
    return path


# --- fixed topologies ---------------------------------------------------------------------------


def test_line_a_b_c():
    """A - B - C"""
    states = states_of(line("A", "B", "C"))
    a = compute_routes("A", states)
    assert dict(a.next_hop) == {"B": "B", "C": "B"}
    assert dict(a.cost) == {"B": 1, "C": 2}
    assert a.reachable == {"B", "C"}
    assert dict(compute_routes("B", states).next_hop) == {"A": "A", "C": "C"}
    assert dict(compute_routes("C", states).next_hop) == {"A": "B", "B": "B"}


def test_star():
    """L1
          |
    L4 -- H -- L2
          |
          L3        every leaf reaches every other leaf through the hub"""
    states = states_of({("H", leaf): 1 for leaf in ("L1", "L2", "L3", "L4")})
    assert dict(compute_routes("H", states).next_hop) == {leaf: leaf for leaf in ("L1", "L2", "L3", "L4")}
    l1 = compute_routes("L1", states)
    assert dict(l1.next_hop) == {"H": "H", "L2": "H", "L3": "H", "L4": "H"}
    assert dict(l1.cost) == {"H": 1, "L2": 2, "L3": 2, "L4": 2}


def test_ring_of_five_goes_the_short_way():
    """A - B - C
    |       |
    E ----- D"""
    states = states_of(ring("A", "B", "C", "D", "E"))
    a = compute_routes("A", states)
    assert dict(a.next_hop) == {"B": "B", "C": "B", "D": "E", "E": "E"}
    assert dict(a.cost) == {"B": 1, "C": 2, "D": 2, "E": 1}


def test_equal_cost_paths_go_through_the_smallest_neighbour_id():
    """A - B
    |   |
    D - C    A to C costs 2 both ways: via B (smaller id than D)"""
    states = states_of(ring("A", "B", "C", "D"))
    assert compute_routes("A", states).next_hop["C"] == "B"
    assert compute_routes("C", states).next_hop["A"] == "B"
    # The same answer whatever order the link states come in.
    assert compute_routes("A", list(reversed(states))) == compute_routes("A", states)


def test_four_router_mesh_with_costs():
    """1        A-B 1, B-C 1, C-D 1 (cheap chain)
     A ----- B      A-C 4, B-D 5, A-D 10 (expensive shortcuts)
     | \\   / |
    10  4 5  1
     | /   \\ |
     D ----- C
         1
    """
    states = states_of({("A", "B"): 1, ("B", "C"): 1, ("C", "D"): 1, ("A", "C"): 4, ("B", "D"): 5, ("A", "D"): 10})
    expected = {
        "A": ({"B": "B", "C": "B", "D": "B"}, {"B": 1, "C": 2, "D": 3}),
        "B": ({"A": "A", "C": "C", "D": "C"}, {"A": 1, "C": 1, "D": 2}),
        "C": ({"A": "B", "B": "B", "D": "D"}, {"A": 2, "B": 1, "D": 1}),
        "D": ({"A": "C", "B": "C", "C": "C"}, {"A": 3, "B": 2, "C": 1}),
    }
    for router, (hops, costs) in expected.items():
        routes = compute_routes(router, states)
        assert (dict(routes.next_hop), dict(routes.cost)) == (hops, costs), router


def test_a_link_costs_the_larger_of_its_two_reported_costs():
    states = [
        LinkState.of("A", 1, "a", 1, {"B": 1, "C": 3}),
        LinkState.of("B", 1, "b", 1, {"A": 5, "C": 1}),
        LinkState.of("C", 1, "c", 1, {"A": 3, "B": 1}),
    ]
    a = compute_routes("A", states)
    assert dict(a.cost) == {"B": 4, "C": 3}  # A-B counts as 5: B via C (3 + 1) is cheaper
    assert dict(a.next_hop) == {"B": "C", "C": "C"}


def test_a_half_reported_link_is_not_used():
    """A says it is linked to B; B does not say so (B lost the link, or B's state
    is stale): neither end routes over it."""
    states = states_of(line("A", "C", "B"), one_sided={("A", "B"): 1})
    assert compute_routes("A", states).next_hop["B"] == "C"
    assert compute_routes("B", states).next_hop["A"] == "C"
    lonely = states_of({}, "AB", one_sided={("A", "B"): 1})
    assert compute_routes("A", lonely).reachable == frozenset()


def test_a_router_with_no_link_state_is_unreachable():
    """A and B report a link to C, but C's state never arrived."""
    states = [LinkState.of("A", 1, "a", 1, {"B": 1, "C": 1}), LinkState.of("B", 1, "b", 1, {"A": 1, "C": 1})]
    assert compute_routes("A", states).reachable == {"B"}


def test_ring_reroutes_when_its_middle_router_dies():
    """A - B - C        B dies: its neighbours A and C withdraw their side of
    |       |        their links to B. B's last state still lists A and C,
    F - E - D        but a half-reported link is not used: A reaches C the long way."""
    db = LinkStateDatabase("A", 1, "a")
    db.local({"B": 1, "F": 1})
    for ls in states_of(ring("A", "B", "C", "D", "E", "F")):
        db.apply(ls)
    before = compute_routes("A", db)
    assert (before.next_hop["C"], before.cost["C"]) == ("B", 2)

    db.local({"F": 1})
    assert db.apply(LinkState.of("C", 1, "boot-C", 2, {"D": 1}))
    after = compute_routes("A", db)
    assert "B" in db.routers()  # its stale state is still there...
    assert "B" not in after.reachable  # ...and attracts nothing
    assert (after.next_hop["C"], after.cost["C"]) == ("F", 4)
    assert follow({r: compute_routes(r, db) for r in "ACDEF"}, "A", "C") == ["A", "F", "E", "D", "C"]


def test_ring_reroutes_when_the_middle_router_is_removed():
    db = LinkStateDatabase("A", 1, "a")
    db.local({"B": 1, "F": 1})
    for ls in states_of(ring("A", "B", "C", "D", "E", "F")):
        db.apply(ls)
    assert db.remove("B")
    routes = compute_routes("A", db)
    assert (routes.next_hop["C"], routes.cost["C"]) == ("F", 4)
    assert "B" not in routes.reachable


# --- the database -------------------------------------------------------------------------------


def test_newer_versions_replace_older_and_older_are_ignored():
    db = LinkStateDatabase("A", 1, "a")
    v2 = LinkState.of("B", 1, "b", 2, {"A": 1})
    assert db.apply(v2)
    assert not db.apply(LinkState.of("B", 1, "b", 1, {"A": 1, "C": 1}))
    assert not db.apply(v2)  # a duplicate
    assert db.get("B") == v2
    assert db.apply(LinkState.of("B", 1, "b", 3, {}))
    assert db.get("B").version == 3


def test_a_newer_epoch_wins_even_with_a_lower_version():
    db = LinkStateDatabase("A", 1, "a")
    db.apply(LinkState.of("B", 1, "b1", 40, {"A": 1, "C": 1}))
    restarted = LinkState.of("B", 2, "b2", 1, {"A": 1})
    assert db.apply(restarted)
    assert db.get("B") == restarted
    # The old incarnation's states, however high their version, stay out.
    assert not db.apply(LinkState.of("B", 1, "b1", 41, {"A": 1, "C": 1}))
    assert db.get("B") == restarted


def test_same_epoch_different_boot_is_ordered_by_boot_id_everywhere():
    x = LinkState.of("B", 3, "xxx", 1, {})
    y = LinkState.of("B", 3, "yyy", 1, {})
    first, second = LinkStateDatabase("A", 1, "a"), LinkStateDatabase("C", 1, "c")
    first.apply(x), first.apply(y)
    second.apply(y), second.apply(x)
    assert first.get("B") == second.get("B") == y


def test_two_different_states_with_one_stamp_are_refused():
    db = LinkStateDatabase("A", 1, "a")
    db.apply(LinkState.of("B", 1, "b", 1, {"A": 1}))
    with pytest.raises(ProtocolError):
        db.apply(LinkState.of("B", 1, "b", 1, {"C": 1}))
    assert db.get("B") == LinkState.of("B", 1, "b", 1, {"A": 1})


def test_our_own_state_changes_only_through_local():
    db = LinkStateDatabase("A", 2, "a2")
    assert db.own == LinkState("A", 2, "a2", 0, ())
    assert not db.apply(LinkState.of("A", 1, "a1", 9, {"B": 1}))  # our previous incarnation's
    assert not db.apply(LinkState.of("A", 3, "zz", 1, {"B": 1}))  # someone claiming our id
    assert db.own.version == 0
    ls = db.local({"C": 2, "B": 1})
    assert ls == LinkState("A", 2, "a2", 1, (("B", 1), ("C", 2)))
    assert db.local({"B": 1, "C": 2}) is None  # unchanged: nothing to flood
    assert db.local({"B": 1}).version == 2
    with pytest.raises(ValueError):
        db.remove("A")


def test_removed_router_stale_copies_stay_out_but_the_same_state_comes_back():
    db = LinkStateDatabase("A", 1, "a")
    db.apply(LinkState.of("B", 1, "b", 5, {"A": 1}))
    assert db.remove("B") and not db.remove("B")
    assert not db.apply(LinkState.of("B", 1, "b", 4, {"A": 1}))  # older: still in flight
    assert db.get("B") is None
    assert db.apply(LinkState.of("B", 1, "b", 5, {"A": 1}))  # B is back, nothing new to say
    assert db.get("B").version == 5


@pytest.mark.parametrize(
    "bad",
    [
        LinkState("B", 1, "b", 1, (("C", 1), ("A", 1))),  # not sorted
        LinkState("B", 1, "b", 1, (("A", 1), ("A", 2))),  # repeated
        LinkState("B", 1, "b", 1, (("B", 1),)),  # a link to itself
        LinkState("B", 1, "b", 1, (("A", 0),)),  # cost below 1
        LinkState("B", 1, "b", 1, (("A", True),)),  # not an int
        LinkState("B", 1, "b", -1, ()),
        LinkState("B", -1, "b", 1, ()),
        LinkState("", 1, "b", 1, ()),
        LinkState("B", 1, "b", 1, [("A", 1)]),
        ("B", 1, "b", 1, ()),
    ],
)
def test_malformed_link_states_are_refused_and_change_nothing(bad):
    db = LinkStateDatabase("A", 1, "a")
    before = db.snapshot()
    with pytest.raises(ProtocolError):
        db.apply(bad)
    assert db.snapshot() == before


def test_digest_lets_two_databases_catch_up():
    left, right = LinkStateDatabase("A", 1, "a"), LinkStateDatabase("B", 1, "b")
    left.local({"B": 1})
    right.local({"A": 1})
    left.apply(LinkState.of("C", 1, "c", 3, {"B": 1}))
    right.apply(LinkState.of("C", 1, "c", 4, {"B": 1, "D": 1}))
    right.apply(LinkState.of("D", 1, "d", 1, {"C": 1}))

    assert left.newer_at_peer(right.digest()) == ["B", "C", "D"]
    assert [ls.origin for ls in right.newer_here(left.digest())] == ["B", "C", "D"]
    for ls in right.newer_here(left.digest()):
        left.apply(ls)
    for ls in left.newer_here(right.digest()):
        right.apply(ls)
    assert left.snapshot() == right.snapshot()
    assert left.newer_here(right.digest()) == [] and left.newer_at_peer(right.digest()) == []
    # Digests survive the wire as plain lists.
    assert left.newer_at_peer({r: list(s) for r, s in right.digest().items()}) == []
    assert isinstance(left.digest()["C"], Stamp)


@given(
    st.lists(
        st.tuples(st.sampled_from("BCD"), st.integers(1, 3), st.sampled_from(["x", "y"]), st.integers(0, 5)),
        min_size=1,
        max_size=30,
    ),
    st.randoms(),
)
def test_any_delivery_order_leaves_the_newest_state_of_each_router(stamps, rnd):
    messages = [LinkState.of(r, e, b, v, {}) for r, e, b, v in set(stamps)]
    in_order, shuffled = LinkStateDatabase("A", 1, "a"), LinkStateDatabase("A", 1, "a")
    for ls in sorted(messages, key=lambda ls: ls.stamp):
        in_order.apply(ls)
    deliveries = messages + [rnd.choice(messages) for _ in range(len(messages))]
    rnd.shuffle(deliveries)
    for ls in deliveries:
        shuffled.apply(ls)
    assert shuffled.snapshot() == in_order.snapshot()
    for router in {ls.origin for ls in messages}:
        assert shuffled.get(router).stamp == max(ls.stamp for ls in messages if ls.origin == router)


# --- splitting by next hop ----------------------------------------------------------------------


def test_one_copy_per_next_hop_carrying_the_destinations_behind_it():
    """E - A - B - C - D      from A, B, C and D all lie behind B: one copy to B
    for {B, C, D}; B then sends one copy to C for {C, D}."""
    states = states_of({**line("A", "B", "C", "D"), ("E", "A"): 1})
    at_a = split_by_next_hop(compute_routes("A", states), ["A", "B", "C", "D", "E", "Z"])
    assert at_a.by_next_hop == {"B": frozenset("BCD"), "E": frozenset("E")}
    assert at_a.unreachable == frozenset("Z")
    by_hop, unreachable = split_by_next_hop(compute_routes("B", states), at_a.by_next_hop["B"])
    assert by_hop == {"C": frozenset("CD")} and unreachable == frozenset()
    assert split_by_next_hop(compute_routes("C", states), by_hop["C"]).by_next_hop == {"D": frozenset("D")}


def test_splitting_nothing_gives_nothing():
    routes = compute_routes("A", states_of(line("A", "B")))
    assert split_by_next_hop(routes, []) == ({}, frozenset())
    assert split_by_next_hop(routes, ["A"]) == ({}, frozenset())


# --- random graphs against a brute force ----------------------------------------------------------


def brute_force_distances(routers: list[str], edges: dict[tuple[str, str], int]) -> dict:
    """Floyd-Warshall over undirected edges: dist[a][b], INF when unreachable."""
    dist = {a: {b: (0 if a == b else INF) for b in routers} for a in routers}
    for (a, b), cost in edges.items():
        dist[a][b] = dist[b][a] = min(dist[a][b], cost)
    for k in routers:
        for i in routers:
            for j in routers:
                if dist[i][k] + dist[k][j] < dist[i][j]:
                    dist[i][j] = dist[i][k] + dist[k][j]
    return dist


@st.composite
def graphs(draw, connected: bool = True):
    """Routers R0..Rn-1, a random spanning tree when ``connected``, extra links,
    small costs (to make ties common) and some one-sided links to ignore."""
    n = draw(st.integers(2, 8))
    routers = [f"R{i}" for i in range(n)]
    draw(st.randoms()).shuffle(routers)  # ids not in tree order
    pairs = [(a, b) for i, a in enumerate(routers) for b in routers[i + 1 :]]
    edges: dict[tuple[str, str], int] = {}
    if connected:
        for i in range(1, n):
            parent = routers[draw(st.integers(0, i - 1))]
            edges[(parent, routers[i])] = draw(st.integers(1, 3))
    for a, b in draw(st.lists(st.sampled_from(pairs), max_size=2 * n)):
        if (a, b) not in edges and (b, a) not in edges:
            edges[(a, b)] = draw(st.integers(1, 3))
    one_sided = {}
    for a, b in draw(st.lists(st.sampled_from(pairs), max_size=3)):
        if (a, b) not in edges and (b, a) not in edges:
            one_sided[(a, b)] = 1
    return routers, edges, one_sided


def check_against_brute_force(routers, edges, one_sided):
    states = states_of(edges, routers, one_sided=one_sided)
    dist = brute_force_distances(routers, edges)
    neighbours = {r: {} for r in routers}
    for (a, b), cost in edges.items():
        neighbours[a][b] = neighbours[b][a] = cost
    all_routes = {r: compute_routes(r, states) for r in routers}
    for source, routes in all_routes.items():
        reachable = {d for d in routers if d != source and dist[source][d] < INF}
        assert routes.reachable == reachable
        assert dict(routes.cost) == {d: dist[source][d] for d in reachable}
        for dest in reachable:
            # The documented tie-break: the smallest neighbour on some shortest path.
            best = min(n for n, cost in neighbours[source].items() if cost + dist[n][dest] == dist[source][dest])
            assert routes.next_hop[dest] == best
            # Hop by hop, each router on its own routes, no loop, at the shortest cost.
            path = follow(all_routes, source, dest)
            assert sum(neighbours[a][b] for a, b in zip(path, path[1:])) == dist[source][dest]
    return all_routes, states


@given(graphs(connected=True), st.randoms())
def test_random_connected_graphs_match_the_brute_force(graph, rnd):
    all_routes, states = check_against_brute_force(*graph)
    for routes in all_routes.values():
        assert routes.reachable == set(graph[0]) - {routes.self_id}
    shuffled = list(states)
    rnd.shuffle(shuffled)
    assert {r: compute_routes(r, shuffled) for r in graph[0]} == all_routes


@given(graphs(connected=False))
def test_random_graphs_match_the_brute_force_including_unreachable(graph):
    check_against_brute_force(*graph)


@given(graphs(connected=True), st.data())
def test_split_covers_every_reachable_destination_once(graph, data):
    routers, edges, one_sided = graph
    states = states_of(edges, routers, one_sided=one_sided)
    source = data.draw(st.sampled_from(routers))
    dests = data.draw(st.sets(st.sampled_from(routers + ["ghost"])))
    routes = compute_routes(source, states)
    by_hop, unreachable = split_by_next_hop(routes, dests)
    assert unreachable == ({"ghost"} & dests)
    flat = [d for group in by_hop.values() for d in group]
    assert sorted(flat) == sorted(dests - {source, "ghost"})
    for hop, group in by_hop.items():
        assert all(routes.next_hop[d] == hop for d in group)


def test_importing_routing_and_membership_does_not_import_proton():
    code = (
        "import sys, router.core.routing, router.core.membership; "
        "assert not [m for m in sys.modules if m.startswith(('proton', 'cproton'))], 'proton imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
