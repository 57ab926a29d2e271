#!/usr/bin/env python3
"""The tables of perf/compare.sh.

  compare.py run RUNDIR   figures of one run (RUNDIR/<workload>/<system>-t<n>-*.json) as JSON
  compare.py table OUT    markdown over OUT/run-*/results.json: per workload, each system at
                          its best thread count per metric, ratios as median (min-max) over runs
  compare.py scale OUT    markdown over OUT/size-*/run-*/results.json (perf/scale.sh): one row
                          per index size, kvix and Dynamo at their best thread count, ratios
  compare.py scale-series OUT
                          the same figures as JSON, one point per size (`kvix-load plot --scale`)
"""
import glob
import json
import os
import re
import statistics
import sys

SYSTEMS = {"kvix": "kvix", "dynamo": "Dynamo 1.6.1", "hello": "tokio-hello"}
# (key, label, higher is better, systems it applies to)
METRICS = [
    ("applied", "events: blocks applied/s", True, ("kvix", "dynamo")),
    ("q16_rps", "/query 1k tokens, 16 conns: req/s", True, ("kvix", "dynamo", "hello")),
    ("q16_p99", "/query 1k tokens, 16 conns: p99 µs", False, ("kvix", "dynamo", "hello")),
    ("q1_p50", "/query 1k tokens, 1 conn: p50 µs", False, ("kvix", "dynamo", "hello")),
    ("bpp", "settled RSS bytes / live (block, worker)", False, ("kvix", "dynamo")),
]


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def phase(report, connections):
    for q in (report or {}).get("queries", []):
        if q["connections"] == connections and q["rate"] == 0:
            return q
    return None


# Lines of a server's log that mean an event was not indexed (Dynamo's listener and
# radix tree log each such event; kvix counts its own in /metrics and tree_sizes).
LOST = re.compile(r"Failed to (decode|apply|find parent)|Gap detected|batches lost")


def lost_events(log):
    try:
        with open(log, errors="replace") as f:
            return sum(1 for line in f if LOST.search(line))
    except OSError:
        return None


def one_config(events, query, log):
    """The figures of one (system, threads) in one run; None where not measured."""
    out = {"log_failures": lost_events(log)}
    if events and events.get("events"):
        e = events["events"]
        out["applied"] = e["blocks_applied_per_sec"]
        out["bpp"] = e.get("bytes_per_live_pair")
        out["live_pairs"] = e["sim"]["live_pairs"]
        out["blocks"] = e["sim"]["blocks_stored"] + e["sim"]["blocks_removed"]
        out["sentinels_seen"] = e["publish"]["all_sentinels_seen"]
        got = e["publish"].get("indexer_tree_sizes_sum")
        # kvix reports tree_sizes (an exact check); Dynamo 1.6.1's replies have none.
        out["tree_sizes_exact"] = None if got is None else got == e["sim"]["live_pairs"] + e["workers"]
        if not out["sentinels_seen"]:
            out["applied"] = None
    q16, q1 = phase(query, 16), phase(query, 1)
    if q16:
        out["q16_rps"] = q16["achieved_rps"] if q16["completed"] else None
        out["q16_p99"] = q16["p99_us"] if q16["completed"] else None
        out["hit_rate"] = q16["hits"] / q16["completed"] if q16["completed"] else None
        out["reply_bytes"] = q16.get("reply_bytes_mean")
        out["errors"] = q16["errors"]
    if q1:
        out["q1_p50"] = q1["p50_us"] if q1["completed"] else None
        out["errors"] = out.get("errors", 0) + q1["errors"]
    return out


def run(rundir):
    res = {"workloads": {}}
    for wdir in sorted(glob.glob(os.path.join(rundir, "*/"))):
        wl = os.path.basename(os.path.dirname(wdir))
        configs = {}
        for qf in sorted(glob.glob(os.path.join(wdir, "*-query.json"))):
            m = re.match(r"(.+)-t(\d+)-query\.json$", os.path.basename(qf))
            if not m:
                continue
            name = f"{m.group(1)}-t{m.group(2)}"
            ev = load(os.path.join(wdir, f"{name}-events.json"))
            configs[name] = one_config(ev, load(qf), os.path.join(wdir, f"{name}.log"))
        res["workloads"][wl] = configs
    return res


def best(configs, system, key, higher):
    """(value, threads) of the system's best thread count for this metric."""
    cands = [
        (c[key], int(name.rsplit("-t", 1)[1]))
        for name, c in configs.items()
        if name.rsplit("-t", 1)[0] == system and c.get(key) is not None
    ]
    if not cands:
        return None
    return (max if higher else min)(cands, key=lambda x: x[0])


def fmt(key, v):
    if v is None:
        return "—"
    if key in ("applied", "q16_rps"):
        return f"{v / 1e6:.2f}M" if v >= 1e6 else f"{v / 1e3:.1f}k"
    if key == "bpp":
        return f"{v:.1f}"
    return f"{v:,.0f}"


def spread(xs, fn=lambda x: f"{x:.2f}×"):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "—"
    med = statistics.median(xs)
    if len(xs) == 1:
        return f"**{fn(med)}**"
    return f"**{fn(med)}** ({fn(min(xs))}–{fn(max(xs))})"


def read_machine(out):
    """OUT/machine.txt (perf/lib.sh describe_machine), or nothing."""
    mf = os.path.join(out, "machine.txt")
    return open(mf).read().strip() if os.path.exists(mf) else ""


def table(out):
    runs = []
    for f in sorted(glob.glob(os.path.join(out, "run-*", "results.json"))):
        r = load(f)
        if r:
            runs.append(r)
    if not runs:
        sys.exit(f"no run-*/results.json under {out}")
    machine = read_machine(out)
    lines = [
        "# kvix vs Dynamo's standalone indexer (perf/compare.sh)",
        "",
        "```",
        machine,
        "```",
        "",
        f"{len(runs)} run(s). Each cell: median over runs (range); each system at its best "
        "thread count (1 or 2) for that metric in that run, the count chosen after the value "
        "(`t1`, `t2`). Ratios are kvix ÷ the other, per run: above 1 is better for kvix on "
        "rates, below 1 on latency and memory. Event streams are vLLM's wire with a nil dp-rank "
        "element and one engine hash per block on every worker, for both systems (what Dynamo "
        "1.6.1 needs to index every event); tokio-hello answers a constant body of the mean size "
        "of kvix's replies (`reply bytes`). `hit %`: replies with a non-empty `scores`.",
    ]
    workloads = sorted({w for r in runs for w in r["workloads"]}, key=lambda w: (w != "trace", w))
    for wl in workloads:
        per_run = [r["workloads"].get(wl, {}) for r in runs]
        lines += ["", f"## {wl}", ""]
        lines += [
            "| metric | kvix | Dynamo 1.6.1 | tokio-hello | kvix / Dynamo | kvix / tokio-hello |",
            "|---|---|---|---|---|---|",
        ]
        for key, label, higher, systems in METRICS:
            cells, bests = [], {}
            for s in ("kvix", "dynamo", "hello"):
                if s not in systems:
                    cells.append("")
                    continue
                b = [best(c, s, key, higher) for c in per_run]
                bests[s] = b
                vals = [x[0] for x in b if x]
                threads = sorted({f"t{x[1]}" for x in b if x})
                if not vals:
                    cells.append("—")
                    continue
                med = statistics.median(vals)
                rng = f" ({fmt(key, min(vals))}–{fmt(key, max(vals))})" if len(vals) > 1 else ""
                cells.append(f"{fmt(key, med)}{rng} {'/'.join(threads)}")
            ratios = []
            for other in ("dynamo", "hello"):
                if other not in bests:
                    ratios.append("")
                    continue
                rs = [
                    k[0] / o[0] if k and o and o[0] else None
                    for k, o in zip(bests["kvix"], bests[other])
                ]
                ratios.append(spread(rs))
            lines.append(f"| {label} | " + " | ".join(cells + ratios) + " |")
        # Every configuration, so the thread counts not chosen are visible too.
        lines += [
            "",
            "Every configuration (median over runs):",
            "",
            "| system | threads | blocks applied/s | bytes / live pair | 16c req/s | 16c p99 µs "
            "| 1c p50 µs | hit % | reply bytes | checks |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        names = sorted(
            {n for c in per_run for n in c},
            key=lambda n: (list(SYSTEMS).index(n.rsplit("-t", 1)[0]), n),
        )
        for n in names:
            sysname, t = n.rsplit("-t", 1)
            cs = [c[n] for c in per_run if n in c]

            def med(key):
                xs = [c.get(key) for c in cs if c.get(key) is not None]
                return statistics.median(xs) if xs else None

            checks = []
            if any(c.get("sentinels_seen") is False for c in cs):
                checks.append("sentinels missed")
            if any(c.get("errors") for c in cs):
                checks.append("query errors")
            te = [c.get("tree_sizes_exact") for c in cs if "tree_sizes_exact" in c]
            if te and all(x is True for x in te):
                checks.append("tree_sizes exact")
            elif any(x is False for x in te):
                checks.append("tree_sizes MISMATCH")
            lost = [c.get("log_failures") for c in cs if c.get("log_failures")]
            if lost:
                checks.append(f"{max(lost)} events not indexed (log)")
            hit, rb = med("hit_rate"), med("reply_bytes")
            lines.append(
                f"| {SYSTEMS.get(sysname, sysname)} | {t} | {fmt('applied', med('applied'))} "
                f"| {fmt('bpp', med('bpp'))} | {fmt('q16_rps', med('q16_rps'))} "
                f"| {fmt('q16_p99', med('q16_p99'))} | {fmt('q1_p50', med('q1_p50'))} "
                f"| {'—' if hit is None else f'{100 * hit:.0f}'} | {'—' if rb is None else f'{rb:.0f}'} "
                f"| {', '.join(checks) or 'ok'} |"
            )
        lp = [c.get("live_pairs") for r in per_run for c in r.values() if c.get("live_pairs")]
        bl = [c.get("blocks") for r in per_run for c in r.values() if c.get("blocks")]
        if lp and bl:
            lines += [
                "",
                f"Event load: {max(bl):,} blocks stored + removed, {max(lp):,} live "
                "(block, worker) pairs at the end.",
            ]
    print("\n".join(lines))


def scale_runs(out):
    """[(size folder name, [results.json of each run])] of a perf/scale.sh folder."""
    sizes = []
    for d in glob.glob(os.path.join(out, "size-*")):
        runs = [load(f) for f in sorted(glob.glob(os.path.join(d, "run-*", "results.json")))]
        runs = [r for r in runs if r]
        if runs:
            sizes.append((os.path.basename(d), runs))
    if not sizes:
        sys.exit(f"no size-*/run-*/results.json under {out}")
    return sizes


def scale_series(out):
    """Per size: live pairs, and per system the median over runs of its best thread
    count's figure for each metric (the table's cells, unrounded)."""
    points = []
    for _, runs in scale_runs(out):
        configs = [r["workloads"].get("shared-prefix", {}) for r in runs]
        lp = [c.get("live_pairs") for r in configs for c in r.values() if c.get("live_pairs")]
        point = {"live_pairs": max(lp) if lp else 0}
        for system in ("kvix", "dynamo"):
            figures = {}
            for key, _, higher, _ in METRICS:
                vals = [b[0] for b in (best(c, system, key, higher) for c in configs) if b]
                figures[key] = statistics.median(vals) if vals else None
            point[system] = figures
        points.append(point)
    points.sort(key=lambda p: p["live_pairs"])
    return {"workload": "shared-prefix", "points": points}


def scale(out):
    sizes = scale_runs(out)
    machine = read_machine(out)
    lines = [
        "# How cost grows with the index: kvix vs Dynamo 1.6.1 (perf/scale.sh)",
        "",
        "```",
        machine,
        "```",
        "",
        "shared-prefix workload (64 workers, random routing), one run per size. Each cell: "
        "kvix / Dynamo, each at its best thread count for that metric, then the ratio "
        "kvix ÷ Dynamo (median over runs if several).",
        "",
        "| live (block, worker) pairs | blocks applied/s | 16c req/s | 16c p99 µs "
        "| 1c p50 µs | RSS bytes / live pair |",
        "|---|---|---|---|---|---|",
    ]
    rows = []
    for name, runs in sizes:
        configs = [r["workloads"].get("shared-prefix", {}) for r in runs]
        lp = [c.get("live_pairs") for r in configs for c in r.values() if c.get("live_pairs")]
        cells = []
        for key, _, higher, _ in METRICS:
            k = [best(c, "kvix", key, higher) for c in configs]
            d = [best(c, "dynamo", key, higher) for c in configs]
            kv = [x[0] for x in k if x]
            dv = [x[0] for x in d if x]
            if not kv or not dv:
                cells.append("—")
                continue
            ratio = spread([a[0] / b[0] if a and b and b[0] else None for a, b in zip(k, d)])
            cells.append(
                f"{fmt(key, statistics.median(kv))} / {fmt(key, statistics.median(dv))}: {ratio}"
            )
        pairs = max(lp) if lp else 0
        rows.append((pairs, f"| {pairs / 1e6:.1f}M | " + " | ".join(cells) + " |"))
    lines += [r for _, r in sorted(rows)]
    print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("run", "table", "scale", "scale-series"):
        sys.exit(__doc__)
    if sys.argv[1] == "run":
        print(json.dumps(run(sys.argv[2]), indent=1))
    elif sys.argv[1] == "scale-series":
        print(json.dumps(scale_series(sys.argv[2]), indent=1))
    elif sys.argv[1] == "scale":
        scale(sys.argv[2])
    else:
        table(sys.argv[2])
