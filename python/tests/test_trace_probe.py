"""bench/probes/sm90_trace.py reads the timelines that FLASHATTN_SM90_TRACE builds write
(src/cuda/sm90/trace.cuh): its event names must follow the kernel's enum, and its phases must come
out of synthetic forward and backward timelines as built."""
import array
import importlib.util
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("sm90_trace", ROOT / "bench" / "probes" / "sm90_trace.py")
sm90_trace = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sm90_trace)


def kernel_events():
    """TraceEvent's enumerators, in order, as trace.cuh declares them."""
    source = (ROOT / "src" / "cuda" / "sm90" / "trace.cuh").read_text()
    body = re.search(r"enum class TraceEvent[^{]*\{(.*?)\};", source, re.S).group(1)
    body = re.sub(r"//[^\n]*", "", body)
    return [name.split("=")[0].strip() for name in body.split(",") if name.strip()]


def write_trace(path, timelines):
    """timelines: {(cta, warpgroup): [(event name, cycle), ...]} in the kernel's file layout."""
    ctas = 1 + max(cta for cta, _ in timelines)
    words = array.array("Q", [0] * (ctas * sm90_trace.WARP_GROUPS * sm90_trace.RECORDS))
    for (cta, wg), events in timelines.items():
        base = (cta * sm90_trace.WARP_GROUPS + wg) * sm90_trace.RECORDS
        for i, (name, cycle) in enumerate(events):
            words[base + i] = (sm90_trace.EVENTS.index(name) << 56) | cycle
    path.write_bytes(words.tobytes())


def test_event_names_follow_the_kernel_enum():
    assert sm90_trace.EVENTS == kernel_events()


def backward_tiles(tiles, steps, epilogue, setup):
    """A consumer warpgroup's backward timeline: a tile's setup, its steps of 5000 cycles (2000 to
    P^T/dS^T, 300 to the dS barrier, 2500 to dK done, 200 to the next step), the epilogue (from the
    last dK done to stored), and 200 cycles to the next tile."""
    events, t = [], 1000
    for _ in range(tiles):
        events += [("tile", t), ("operands", t + 100)]
        t += setup
        for _ in range(steps):
            events += [("step", t), ("scores", t + 2000), ("ds_shared", t + 2300), ("step_done", t + 4800)]
            t += 5000
        events.append(("stored", t - 200 + epilogue))
        t += epilogue
    return events


def test_backward_phases(tmp_path):
    path = tmp_path / "backward.bin"
    write_trace(path, {(0, 1): backward_tiles(4, 8, 9000, 1500), (1, 2): backward_tiles(4, 8, 9000, 1500)})
    result = sm90_trace.analyse_backward(sm90_trace.read(path))
    assert result["step_period_cycles"] == 5000
    assert result["steps_per_tile"] == 8
    assert result["tiles"] == 6  # the last tile of each warpgroup has no next one to end it
    # A tile is its setup, 8 steps and the epilogue: beyond 8 periods, the setup and the epilogue.
    assert result["tile_overhead_cycles"] == 1500 + 9000
    phases = {name: ph["median"] for name, ph in result["phases"].items()}
    assert phases["mid: step -> P^T, dS^T"] == 2000
    assert phases["mid: P^T, dS^T -> dS barrier"] == 300
    assert phases["mid: dS barrier -> dK done"] == 2500
    assert phases["mid: dK done -> next step"] == 200
    assert phases["end: last dK done -> dK, dV stored"] == 9000
    assert phases["start: tile -> K, V ready"] == 100
    assert phases["end: stored -> next tile"] == 200
    # From the last dK done: the step's last 200 cycles, the epilogue, the next tile's setup.
    assert phases["boundary: last dK done -> next first step"] == 200 + 9000 + 1500


def test_forward_phases(tmp_path):
    events, t = [], 1000
    for _ in range(3):
        events += [("tile", t), ("planned", t + 10), ("operands", t + 30)]
        t += 50
        for _ in range(6):
            events += [("turn", t), ("s_done", t + 500), ("softmax", t + 2000), ("pv_done", t + 2100)]
            t += 2900
        events += [("turn", t), ("pv_done", t + 100), ("finalized", t + 300), ("stored", t + 400)]
        t += 600
    path = tmp_path / "forward.bin"
    write_trace(path, {(0, 1): events})
    result = sm90_trace.analyse(sm90_trace.read(path))
    assert result["turn_period_cycles"] == 2900
    assert result["blocks_per_tile"] == 6
    assert result["tile_overhead_cycles"] == 50 + 600
    phases = {name: ph["median"] for name, ph in result["phases"].items()}
    assert phases["mid: S done -> softmax done"] == 1500
    assert phases["end: normalized -> store issued"] == 100
