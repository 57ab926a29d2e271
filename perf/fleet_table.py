#!/usr/bin/env python3
"""perf/fleet.sh's results as one table (DIR/fleet.md) and one series for the plot
(DIR/fleet.json, `kvix-load plot --fleet`).

    perf/fleet_table.py DIR "16 300 1000 3000 8000" "kvix dynamo"

Reads each run's files in DIR: SYSTEM-wN.json (wall time, descriptors, or why it was
skipped), SYSTEM-wN-events-K.json (one per load tool, figures summed) and
SYSTEM-wN-query.json. A system that failed at a size has no point there.
"""
import json
import os
import sys

out, workers, systems = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()


def read(name):
    p = os.path.join(out, name)
    return json.load(open(p)) if os.path.exists(p) else {}


def events(s, w):
    """The load tools' event figures summed: blocks/s, and RSS growth per live pair."""
    evs = [read(f"{s}-w{w}-events-{k}.json").get("events", {}) for k in range(8)]
    evs = [e for e in evs if e]
    pairs = sum(e["sim"]["live_pairs"] for e in evs) if evs else 0
    rss = [(e.get("rss_before_bytes"), e.get("rss_after_bytes")) for e in evs]
    growth = (max(a for _, a in rss) - min(b for b, _ in rss)) if evs and all(
        b and a for b, a in rss) else 0
    return {"applied": sum(e.get("blocks_applied_per_sec", 0) for e in evs),
            "bpp": growth / pairs if pairs else None, "pairs": pairs}


rows = ["| workers | system | register + apply (s) | blocks applied/s | RSS B/live pair | fds | "
        "p50 / p99 µs, 16 conns | req/s, 16 conns | p50 / p99 µs, 1 conn |",
        "|---|---|---|---|---|---|---|---|---|"]
points = []
for w in workers:
    point = {"workers": int(w)}
    for s in systems:
        base = read(f"{s}-w{w}.json")
        if not base or "skipped" in base or "failed" in base:
            why = base.get("skipped", "failed (see its log)") if base else "not run"
            rows.append(f"| {w} | {s} | {why} | | | | | | |")
            point[s] = {}
            continue
        ev = events(s, w)
        q = {x["connections"]: x for x in read(f"{s}-w{w}-query.json").get("queries", [])}

        def lat(c):
            x = q.get(c)
            return f"{x['p50_us']:.0f} / {x['p99_us']:.0f}" if x else ""
        rps = f"{q[16]['achieved_rps']:.0f}" if 16 in q else ""
        bpp = f"{ev['bpp']:.1f}" if ev["bpp"] else ""
        rows.append(f"| {w} | {s} | {base.get('events_wall_secs', 0):.1f} | "
                    f"{ev['applied'] / 1e6:.2f}M | {bpp} | {base.get('fds', '')} | "
                    f"{lat(16)} | {rps} | {lat(1)} |")
        point["live_pairs"] = max(point.get("live_pairs", 0), ev["pairs"])
        point[s] = {"applied": ev["applied"], "bpp": ev["bpp"],
                    "q16_rps": q[16]["achieved_rps"] if 16 in q else None,
                    "q16_p99": q[16]["p99_us"] if 16 in q else None,
                    "q1_p50": q[1]["p50_us"] if 1 in q else None}
    points.append(point)

with open(os.path.join(out, "fleet.md"), "w") as f:
    f.write("\n".join(rows) + "\n")
with open(os.path.join(out, "fleet.json"), "w") as f:
    json.dump({"workload": "trace", "points": points}, f, indent=1)
