"""Placement (laned.core.placement) without I/O: footprints from each engine's rule, which
lanes run together, and what an activation takes off — single cases, and properties over
hosts and lanes that hypothesis draws: it never takes off a lane that shares nothing with
the new one, the new lane always fits after, nothing it takes off could have stayed, and with
lanes that each want the whole box it is the one-lane-at-a-time of groups exactly."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from laned.core.facts import GpuReading
from laned.core.gpu_memory import held
from laned.core.placement import (
    EVERY,
    Footprint,
    common,
    cost,
    evictions,
    fits,
    never,
    per_gpu,
    together,
)
from laned.engines.footprints import footprints, never_peers
from laned.validation.load import parse_config

GIB = 2**30
FOUR = {i: 96 * GIB for i in range(4)}


def fp(
    name: str, gpus: tuple[int, ...] | None, share: float | None = None, **kw: object
) -> Footprint:
    port = kw.pop("port", abs(hash(name)) % 50000 + 1000)
    return Footprint(name, gpus, share, port=port, rule="r", **kw)  # type: ignore[arg-type]


def test_each_engine_says_what_it_takes_and_needs_fill_in_where_it_cannot() -> None:
    text = """
[lanes.v]
port = 8001
served_model_name = "v"
gpus = [2, 3]
args = ["--gpu-memory-utilization", "0.45"]
[lanes.v.exec]
command = ["vllm", "serve", "m"]
[lanes.d]
port = 8002
served_model_name = "d"
[lanes.d.exec]
command = ["vllm", "serve", "m"]
[lanes.g]
port = 8003
served_model_name = "g"
[lanes.g.exec]
command = ["python3", "-m", "sglang.launch_server", "--model-path", "m"]
[lanes.l]
port = 8004
served_model_name = "l"
needs = { gpu_memory_gib = 20 }
[lanes.l.env]
CUDA_VISIBLE_DEVICES = "1"
[lanes.l.exec]
command = ["llama-server", "-m", "m.gguf"]
"""
    fps = footprints(parse_config(text, "t.toml", {"HOME": "/h"}).lanes)
    assert (fps["v"].gpus, fps["v"].share, fps["v"].rule) == (
        (2, 3),
        0.45,
        "--gpu-memory-utilization 0.45",
    )
    assert fps["d"].gpus is None and fps["d"].share == 0.92 and "vLLM's default" in fps["d"].rule
    assert fps["g"].share is None and fps["g"].gib is None and "SGLang takes" in fps["g"].rule
    assert (fps["l"].gpus, fps["l"].gib) == ((1,), 20.0)
    assert fps["l"].demand(1, FOUR) == 20 * GIB
    # Whole GPUs (SGLang) and shares over 1 never run together anywhere; GiB sizes might.
    assert never(fps["g"], fps["v"]) and never(fps["d"], fps["v"])
    assert never(fps["l"], fps["v"]) == ""  # no GPU in common


def test_a_share_written_in_the_command_counts_as_one_in_args() -> None:
    # The engine reads its flags wherever they are; so does laned (LaneConfig.engine_args).
    text = """
[lanes.a]
port = 8001
served_model_name = "a"
gpus = [0]
[lanes.a.exec]
command = ["taskset", "-c", "0-7", "vllm", "serve", "/m", "--gpu-memory-utilization", "0.4"]
[lanes.b]
port = 8002
served_model_name = "b"
gpus = [0]
[lanes.b.container]
image = "docker.io/vllm/vllm-openai:v0.32.0"
command = ["/m", "--gpu-memory-utilization=0.5"]
"""
    fps = footprints(parse_config(text, "t.toml", {"HOME": "/h"}).lanes)
    assert (fps["a"].share, fps["b"].share) == (0.4, 0.5)
    assert together(fps["a"], fps["b"], {0: 80 * GIB})[0]


def test_fit_on_a_four_gpu_host_and_the_reasons_say_how_much() -> None:
    big, s1, s2 = fp("big", (0, 1), 0.9), fp("s1", (2, 3), 0.45), fp("s2", (2, 3), 0.45)
    assert together(big, s1, FOUR) == (True, "no GPU in common")
    assert together(s1, s2, FOUR) == (True, "both fit on GPU 2, 3")
    s3 = fp("s3", (3,), 0.2)
    assert fits(s3, [s1], FOUR) == ""
    why = fits(s3, [s1, s2], FOUR)
    assert why.startswith("GPU 3: s3 19.2 GiB (r) + s1 43.2 GiB (r) + s2 43.2 GiB (r)")
    assert why.endswith("is more than its 96.0 GiB")
    # No NVML: shares still add up; GiB sizes cannot be told, and are kept apart.
    assert together(s1, s2, None)[0] and not together(s1, fp("w", None, 0.92), None)[0]
    sized = Footprint("z", (2,), gib=10.0, rule="needs", port=1)
    ok, why = together(s1, sized, None)
    assert not ok and "not known here (no NVML)" in why
    assert together(s1, sized, FOUR)[0]


def test_a_group_and_a_port_keep_lanes_apart_whatever_the_memory() -> None:
    a, b = fp("a", (0,), 0.1, group="x"), fp("b", (1,), 0.1, group="x")
    assert together(a, b, FOUR) == (False, "both are of group x (never together)")
    c, d = fp("c", (0,), 0.1, port=8000), fp("d", (1,), 0.1, port=8000)
    assert together(c, d, FOUR) == (False, "both listen on port 8000")
    assert evictions(a, [b], FOUR, {}).lanes == ("b",)


def test_a_whole_gpu_lane_is_apart_for_that_reason_whether_or_not_the_gpus_are_known() -> None:
    whole = Footprint("gguf", (0,), rule="llama.cpp", port=1)
    half = fp("v", (0, 1), 0.5)
    ok, why = together(whole, half, None)
    assert not ok and why == "GPU 0: gguf the whole GPU (llama.cpp): nothing runs beside it"
    ok, why = together(whole, half, FOUR)
    assert not ok and "gguf the whole GPU (llama.cpp) + v 48.0 GiB" in why


def test_the_cheapest_lane_goes_and_nothing_else() -> None:
    big, s1, s2, s4 = (fp("big", (0, 1), 0.9), fp("s1", (2, 3), 0.45),
                       fp("s2", (2, 3), 0.45), fp("s4", (2, 3), 0.45))  # fmt: skip
    costs = {"big": 10.0, "s1": 30.0, "s2": 20.0}
    out = evictions(s4, [big, s1, s2], FOUR, costs)
    assert out.lanes == ("s2",) and out.fits and "room for s4 on GPU 2, 3" in out.why["s2"]
    whole = fp("whole", None, 0.92)
    assert evictions(whole, [big, s1, s2], FOUR, costs).lanes == ("big", "s1", "s2")
    assert evictions(big, [whole], FOUR, {}).lanes == ("whole",)
    # A pinned lane goes only where nothing else frees the room.
    pinned = {"s1": cost(30.0, 0, 0, True), "s2": cost(300.0, 5, 2, False)}
    assert evictions(s4, [s1, s2], FOUR, pinned).lanes == ("s2",)


def test_a_sleeper_stays_where_the_new_lane_fits_beside_it_and_goes_where_it_is_in_the_way() -> (
    None
):
    z = Footprint.asleep("z", {0: 8 * GIB}, 9000)  # what it kept on GPU 0 at its last sleep
    assert z.demand(0, FOUR) == 8 * GIB and z.demand(1, FOUR) == 0
    assert z.says(0, FOUR) == "z 8.0 GiB (asleep)"
    # 86.4 + 8 of 96 GiB: beside it; 91.2 + 8: it goes; on another GPU, or of a group: stays.
    assert evictions(fp("a", (0,), 0.9), [z], FOUR, {}).lanes == ()
    out = evictions(fp("b", (0,), 0.95), [z], FOUR, {})
    assert out.lanes == ("z",) and out.fits and "z 8.0 GiB (asleep)" in out.why["z"]
    assert evictions(fp("c", (1,), 0.95), [z], FOUR, {}).lanes == ()
    assert evictions(fp("d", (0,), 0.9, group="x"), [z], FOUR, {}).lanes == ()
    # Beside a running lane, the cheaper of the two goes.
    r, new = fp("r", (0,), 0.5), fp("new", (0,), 0.45)
    assert evictions(new, [r, z], FOUR, {"r": 100.0, "z": 30.0}).lanes == ("z",)
    assert evictions(new, [r, z], FOUR, {"r": 10.0, "z": 30.0}).lanes == ("r",)
    row = per_gpu([r, z], FOUR)[0]
    assert row.lanes == (("r", 48 * GIB), ("z", 8 * GIB)) and row.left == 40 * GIB


def test_costs_weigh_the_swap_back_the_requests_and_priority() -> None:
    assert cost(None, 0, 0, False) == 30.0  # never measured
    assert cost(100.0, 2, 0, False) == 300.0  # its swap back, once more per request
    assert cost(100.0, 0, 1, False) == 160.0
    assert cost(0.0, 0, -5, False) == 0.0
    assert cost(1.0, 0, 0, True) > cost(1e5, 100, 10, False)


def test_per_gpu_shows_who_is_placed_and_what_is_left() -> None:
    rows = per_gpu([fp("big", (0, 1), 0.5), fp("s1", (2,), None)], FOUR)
    assert [r.index for r in rows] == [0, 1, 2, 3]
    assert rows[0].lanes == (("big", 48 * GIB),) and rows[0].left == 48 * GIB
    assert rows[2].lanes == (("s1", 96 * GIB),) and rows[2].left == 0  # the whole GPU
    assert rows[3].lanes == () and rows[3].left == 96 * GIB
    unknown = per_gpu([fp("a", None, 0.5)], None)
    assert unknown[0].index == EVERY and unknown[0].left is None


def test_systemd_gets_conflicts_only_for_lanes_that_can_never_run_together() -> None:
    text = "".join(
        f'[lanes.{n}]\nport = {p}\nserved_model_name = "{n}"\n{extra}'
        f'[lanes.{n}.exec]\ncommand = ["vllm", "serve", "m"]\n'
        for n, p, extra in (
            ("big", 8001, 'gpus = [0, 1]\nargs = ["--gpu-memory-utilization", "0.9"]\n'),
            ("s1", 8002, 'gpus = [2, 3]\nargs = ["--gpu-memory-utilization", "0.45"]\n'),
            ("s2", 8003, 'gpus = [2, 3]\nargs = ["--gpu-memory-utilization", "0.45"]\n'),
            ("whole", 8004, ""),
        )
    )
    lanes = parse_config(text, "t.toml", {"HOME": "/h"}).lanes
    assert never_peers(lanes, "s1") == ["whole"]
    assert never_peers(lanes, "whole") == ["big", "s1", "s2"]


def test_the_gate_leaves_the_staying_lanes_memory_to_them_and_waits_for_room() -> None:
    def gpu(processes: tuple[tuple[int, int], ...]) -> GpuReading:
        return GpuReading(2, "g", 96 * GIB, sum(u for _, u in processes), processes)

    staying = {10: "s1"}
    # A lane taken off still holds memory: wait for it, whoever stays.
    busy = held([gpu(((10, 43 * GIB), (20, 40 * GIB)))], GIB, (), staying, {2: 43 * GIB})
    assert busy == ["GPU 2 has 40.00 GiB in use by pid 20"]
    # Only the staying lane: room enough, the gate opens.
    assert held([gpu(((10, 43 * GIB),))], GIB, (), staying, {2: 43 * GIB}) == []
    # Not room enough beside it: say whose memory it waits for.
    short = held([gpu(((10, 60 * GIB),))], GIB, (), staying, {2: 43 * GIB})
    assert short == [
        "GPU 2 has 36.0 GiB free, the lane takes 43.0 GiB; held by lane s1 60.0 GiB (pid 10)"
    ]
    # Nobody stays: the gate of before (free of other processes).
    assert held([gpu(((10, 43 * GIB),))], GIB) == ["GPU 2 has 43.00 GiB in use by pid 10"]


# --- properties -----------------------------------------------------------------------------

SHARES = st.sampled_from([0.1, 0.2, 0.3, 0.45, 0.5, 0.6, 0.9, 0.92])


@st.composite
def footprint(draw: st.DrawFn, name: str) -> Footprint:
    gpus = draw(
        st.one_of(st.none(), st.lists(st.integers(0, 3), min_size=1, max_size=4, unique=True))
    )
    share = draw(st.one_of(st.none(), SHARES))
    gib = (
        None
        if share is not None
        else draw(st.one_of(st.none(), st.sampled_from([10.0, 40.0, 100.0])))
    )
    group = draw(st.sampled_from([None, None, None, "x"]))
    return Footprint(
        name,
        None if gpus is None else tuple(sorted(gpus)),
        share,
        gib,
        "r",
        group,
        8000 + len(name) * 7 + ord(name[-1]),
    )


@st.composite
def scene(
    draw: st.DrawFn,
) -> tuple[Footprint, list[Footprint], dict[str, float], dict[int, int] | None]:
    totals = draw(st.sampled_from([FOUR, None]))
    placed: list[Footprint] = []
    for i in range(draw(st.integers(0, 6))):
        candidate = draw(footprint(f"p{i}"))
        if not fits(candidate, placed, totals):  # what runs fits together, as placement keeps it
            placed.append(candidate)
    if totals is not None:  # sleepers, placed by what they keep (known only with NVML)
        for i in range(draw(st.integers(0, 2))):
            kept = draw(st.dictionaries(st.integers(0, 3), st.integers(1, 12), max_size=2))
            sleeper = Footprint.asleep(f"z{i}", {g: n * GIB for g, n in kept.items()}, 9000 + i)
            if kept and not fits(sleeper, placed, totals):
                placed.append(sleeper)
    lane = draw(footprint("new"))
    costs = {p.lane: draw(st.floats(0, 1000)) for p in placed}
    return lane, placed, costs, totals


@settings(max_examples=300, deadline=None)
@given(scene())
def test_an_activation_takes_off_only_what_it_must_and_then_fits(
    drawn: tuple[Footprint, list[Footprint], dict[str, float], dict[int, int] | None],
) -> None:
    lane, placed, costs, totals = drawn
    out = evictions(lane, placed, totals, costs)
    gone = set(out.lanes)
    for p in placed:
        unrelated = not common(lane, p, totals) and not (lane.group and lane.group == p.group)
        if unrelated and lane.port != p.port:
            assert p.lane not in gone, "a lane that shares nothing with it was taken off"
    rest = [p for p in placed if p.lane not in gone]
    if out.fits:
        assert fits(lane, rest, totals) == "", "it would start into memory another lane holds"
        for p in placed:
            if p.lane in gone and together(lane, p, totals)[0]:
                kept = [q for q in placed if q.lane not in gone or q is p]
                assert fits(lane, kept, totals), f"{p.lane} could have stayed"


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 6),
    st.sampled_from([FOUR, None]),
    st.lists(SHARES.filter(lambda s: s > 0.5), min_size=7, max_size=7),
)
def test_with_lanes_that_each_want_the_whole_box_it_is_one_lane_at_a_time(
    n: int, totals: dict[int, int] | None, shares: list[float]
) -> None:
    # Every lane on every GPU, each wanting more than half: today's single group exactly.
    lanes = [Footprint(f"l{i}", None, shares[i], rule="r", port=8000 + i) for i in range(n + 1)]
    new, placed = lanes[0], lanes[1:]
    assert evictions(new, placed, totals, {}).lanes == tuple(p.lane for p in placed)
    assert all(never(new, p) for p in placed)
