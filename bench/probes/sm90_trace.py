#!/usr/bin/env python3
"""Reads the timeline of one sm90 forward or backward call (a FLASHATTN_SM90_TRACE build, see
src/cuda/sm90/trace.cuh) and prints, in SM clock cycles, medians over every tile of
every CTA. Forward:
  - the steady GEMM-turn period of a consumer warpgroup (one turn of each warpgroup: two
    blocks' QK^T + P.V on the tensor cores), and what a middle block spends in each phase;
  - the tile boundary, phase by phase: last P.V, normalization, epilogue, waiting for the next
    tile, planning it, its operands, its first QK^T and first softmax;
  - each tile's time beyond blocks x period: what a tile costs over its key blocks.
Backward (a timeline with step records): the steady step period and a middle step's phases
(S^T and dP^T to P^T and dS^T, the dS barrier, the dQ, dV and dK GEMMs), the first step's, the
tile boundary (epilogue, next index, K and V, first step), each tile's time beyond steps x
period, and where a warpgroup's whole timeline went (steps at the steady period, beyond it).

  sm90_trace.py TRACE_FILE [--json OUT]
"""
import argparse
import array
import json
import statistics
import sys

EVENTS = ["none", "tile", "planned", "operands", "turn", "s_done", "softmax", "pv_done", "finalized",
          "stored", "step", "scores", "ds_shared", "step_done"]
WARP_GROUPS = 4  # kTraceWarpGroups (0, the producer, records nothing)
RECORDS = 4096   # kTraceRecords


def read(path):
    data = array.array("Q")
    with open(path, "rb") as f:
        data.frombytes(f.read())
    if sys.byteorder != "little":
        data.byteswap()
    per_cta = WARP_GROUPS * RECORDS
    ctas = len(data) // per_cta
    timelines = {}
    for cta in range(ctas):
        for wg in range(WARP_GROUPS):
            base = (cta * WARP_GROUPS + wg) * RECORDS
            events = []
            for word in data[base:base + RECORDS]:
                if word == 0:
                    break
                events.append((EVENTS[word >> 56], word & ((1 << 56) - 1)))
            if events:
                timelines[(cta, wg)] = events
    return timelines


def tiles_of(events):
    """Splits a consumer's timeline at its 'tile' records."""
    tiles, current = [], None
    for name, t in events:
        if name == "tile":
            current = []
            tiles.append(current)
        if current is not None:
            current.append((name, t))
    return tiles


def first(tile, name, after=0):
    for name_i, t in tile:
        if name_i == name and t >= after:
            return t
    return None


def summary(values):
    ordered = sorted(values)
    return {"median": statistics.median(ordered), "p10": ordered[len(ordered) // 10],
            "p90": ordered[len(ordered) * 9 // 10], "count": len(ordered)}


def tile_summary(tile_rows, period, per_tile):
    """tile_rows: (units, cycles) per tile; period: the steady cycles of a unit (a block or a step)."""
    over = [duration - units * period for units, duration in tile_rows]
    return {
        "tiles": len(tile_rows),
        per_tile: statistics.median([u for u, _ in tile_rows]) if tile_rows else 0,
        "tile_cycles": statistics.median([d for _, d in tile_rows]) if tile_rows else 0,
        "tile_overhead_cycles": statistics.median(over) if over else 0,
    }


class Phases:
    """Cycles per named phase; add() skips a phase the tile did not record (None)."""

    def __init__(self):
        self.values = {}

    def add(self, name, value):
        if value is not None:
            self.values.setdefault(name, []).append(value)

    def summaries(self):
        return {name: summary(v) for name, v in self.values.items()}


def consumer_tiles(timelines):
    """(events, tiles) of each consumer warpgroup's timeline (warpgroup 0 is the producer)."""
    for (_, wg), events in timelines.items():
        if wg != 0:
            yield events, tiles_of(events)


def analyse(timelines):
    phases = Phases()
    add = phases.add
    periods, tile_rows = [], []
    for _, tiles in consumer_tiles(timelines):
        for i, tile in enumerate(tiles):
            turns = [t for name, t in tile if name == "turn"]
            blocks = len(turns) - 1
            if blocks < 1:
                continue
            # Middle blocks: turn -> S done -> softmax done -> P.V done -> next turn.
            middle = turns[1:-1]
            for k, t_turn in enumerate(middle):
                periods.append(turns[k + 2] - t_turn)
                s_done = first(tile, "s_done", t_turn)
                soft = first(tile, "softmax", t_turn)
                pv = first(tile, "pv_done", t_turn)
                if None not in (s_done, soft, pv):
                    add("mid: turn -> S done", s_done - t_turn)
                    add("mid: S done -> softmax done", soft - s_done)
                    add("mid: softmax -> P.V done", pv - soft)
                    add("mid: P.V done -> next turn", turns[k + 2] - pv)
            # Boundary, from the tile's last turn (P.V only) into the next tile.
            t_last = turns[-1]
            pv_last = first(tile, "pv_done", t_last)
            fin = first(tile, "finalized", t_last)
            stored = first(tile, "stored", t_last)
            add("end: last turn -> P.V done", None if pv_last is None else pv_last - t_last)
            add("end: P.V done -> normalized", None if None in (pv_last, fin) else fin - pv_last)
            add("end: normalized -> store issued", None if None in (fin, stored) else stored - fin)
            t_tile = tile[0][1]
            planned = first(tile, "planned")
            operands = first(tile, "operands")
            s0 = first(tile, "s_done", turns[0])
            soft0 = first(tile, "softmax", turns[0])
            add("start: tile -> planned", planned - t_tile if planned else None)
            add("start: planned -> Q, K ready", operands - planned if operands and planned else None)
            add("start: Q, K ready -> first turn", turns[0] - operands if operands else None)
            add("start: first turn -> S done", s0 - turns[0] if s0 else None)
            add("start: S done -> softmax done", soft0 - s0 if soft0 and s0 else None)
            add("start: softmax done -> second turn", turns[1] - soft0 if soft0 else None)
            if i + 1 < len(tiles):
                t_next = tiles[i + 1][0][1]
                add("end: store issued -> next tile", t_next - stored if stored else None)
                tile_rows.append((blocks, t_next - t_tile))
    period = statistics.median(periods) if periods else 0
    return {"turn_period_cycles": period, **tile_summary(tile_rows, period, "blocks_per_tile"),
            "phases": phases.summaries()}


def analyse_backward(timelines):
    phases = Phases()
    add = phases.add
    periods, tile_rows, spans = [], [], []
    for events, tiles in consumer_tiles(timelines):
        for i, tile in enumerate(tiles):
            steps = [t for name, t in tile if name == "step"]
            done = [t for name, t in tile if name == "step_done"]
            if not steps or len(done) != len(steps):
                continue
            for k in range(1, len(steps) - 1):  # middle steps
                periods.append(steps[k + 1] - steps[k])
                scores, ds = first(tile, "scores", steps[k]), first(tile, "ds_shared", steps[k])
                if None not in (scores, ds):
                    add("mid: step -> P^T, dS^T", scores - steps[k])
                    add("mid: P^T, dS^T -> dS barrier", ds - scores)
                    add("mid: dS barrier -> dK done", done[k] - ds)
                    add("mid: dK done -> next step", steps[k + 1] - done[k])
            scores0, ds0 = first(tile, "scores", steps[0]), first(tile, "ds_shared", steps[0])
            if None not in (scores0, ds0):
                add("first: step -> P^T, dS^T", scores0 - steps[0])
                add("first: P^T, dS^T -> dS barrier", ds0 - scores0)
                add("first: dS barrier -> dK done", done[0] - ds0)
            t_tile, operands, stored = tile[0][1], first(tile, "operands"), first(tile, "stored", done[-1])
            add("start: tile -> K, V ready", operands - t_tile if operands else None)
            add("start: K, V ready -> first step", steps[0] - operands if operands else None)
            add("end: last dK done -> dK, dV stored", stored - done[-1] if stored else None)
            if i + 1 < len(tiles):
                t_next = tiles[i + 1][0][1]
                add("end: stored -> next tile", t_next - stored if stored else None)
                nxt = [t for name, t in tiles[i + 1] if name == "step"]
                if nxt:
                    add("boundary: last dK done -> next first step", nxt[0] - done[-1])
                tile_rows.append((len(steps), t_next - t_tile))
        starts = [t for name, t in events if name == "tile"]
        ends = [t for name, t in events if name == "stored"]
        if starts and ends:
            spans.append((ends[-1] - starts[0], sum(1 for name, _ in events if name == "step")))
    period = statistics.median(periods) if periods else 0
    beyond = [span - steps * period for span, steps in spans]
    return {
        "step_period_cycles": period, **tile_summary(tile_rows, period, "steps_per_tile"),
        "timeline_cycles": statistics.median([s for s, _ in spans]) if spans else 0,
        "timeline_beyond_steps_cycles": statistics.median(beyond) if beyond else 0,
        "phases": phases.summaries(),
    }


def print_backward(path, result):
    print(f"{path}: backward, {result['tiles']} warpgroup tiles, {result['steps_per_tile']} steps each (median)")
    print(f"  step period (steady, per warpgroup) {result['step_period_cycles']:8.0f} cycles")
    print(f"  tile                                {result['tile_cycles']:8.0f} cycles")
    print(f"  tile beyond steps x period          {result['tile_overhead_cycles']:8.0f} cycles")
    print(f"  warpgroup's timeline                {result['timeline_cycles']:8.0f} cycles")
    print(f"  ... beyond its steps x period       {result['timeline_beyond_steps_cycles']:8.0f} cycles")
    order = ["mid: step -> P^T, dS^T", "mid: P^T, dS^T -> dS barrier", "mid: dS barrier -> dK done",
             "mid: dK done -> next step", "first: step -> P^T, dS^T", "first: P^T, dS^T -> dS barrier",
             "first: dS barrier -> dK done", "end: last dK done -> dK, dV stored", "end: stored -> next tile",
             "start: tile -> K, V ready", "start: K, V ready -> first step",
             "boundary: last dK done -> next first step"]
    print(f"  {'phase':42s} {'median':>8s} {'p10':>8s} {'p90':>8s}")
    for name in order:
        if name in result["phases"]:
            ph = result["phases"][name]
            print(f"  {name:42s} {ph['median']:8.0f} {ph['p10']:8.0f} {ph['p90']:8.0f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--json")
    args = ap.parse_args()
    timelines = read(args.trace)
    if any(name == "step" for events in timelines.values() for name, _ in events):
        result = analyse_backward(timelines)
        print_backward(args.trace, result)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        return
    result = analyse(timelines)
    print(f"{args.trace}: {result['tiles']} tiles, {result['blocks_per_tile']} key blocks each (median)")
    print(f"  turn period (steady, per warpgroup) {result['turn_period_cycles']:8.0f} cycles")
    print(f"  tile                                {result['tile_cycles']:8.0f} cycles")
    print(f"  tile beyond blocks x period         {result['tile_overhead_cycles']:8.0f} cycles")
    order = ["mid: turn -> S done", "mid: S done -> softmax done", "mid: softmax -> P.V done",
             "mid: P.V done -> next turn", "end: last turn -> P.V done", "end: P.V done -> normalized",
             "end: normalized -> store issued", "end: store issued -> next tile", "start: tile -> planned",
             "start: planned -> Q, K ready", "start: Q, K ready -> first turn", "start: first turn -> S done",
             "start: S done -> softmax done", "start: softmax done -> second turn"]
    print(f"  {'phase':40s} {'median':>8s} {'p10':>8s} {'p90':>8s}")
    for name in order:
        if name in result["phases"]:
            ph = result["phases"][name]
            print(f"  {name:40s} {ph['median']:8.0f} {ph['p10']:8.0f} {ph['p90']:8.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
