#!/usr/bin/env python3
"""The tables of perf/compare.sh.

  compare.py run RUNDIR   figures of one run (RUNDIR/<workload>/<system>-t<n>-*.json) as JSON
  compare.py table OUT    markdown over OUT/run-*/results.json: per workload and thread count,
                          every system's latency (closed and open loop); throughput, events
                          and memory at each system's best thread count; ratios as median
                          (min-max) over runs
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

SYSTEMS = {
    "kvix": "kvix",
    "dynamo": "Dynamo 1.6.1",
    "hello": "tokio-hello",
    "ghello": "glommio-hello",
    "before": "kvix before (--before)",
}
# (key, label, higher is better, systems it applies to)
METRICS = [
    ("applied", "events: blocks applied/s", True, ("kvix", "dynamo")),
    ("applied_apart", "events, engine hashes apart: blocks applied/s", True, ("kvix", "dynamo")),
    ("q16_rps", "/query 1k tokens, 16 conns: req/s", True, ("kvix", "dynamo", "hello", "ghello")),
    ("q16_p99", "/query 1k tokens, 16 conns: p99 µs", False, ("kvix", "dynamo", "hello", "ghello")),
    ("q1_p50", "/query 1k tokens, 1 conn: p50 µs", False, ("kvix", "dynamo", "hello", "ghello")),
    ("bpp", "settled RSS bytes / live (block, worker)", False, ("kvix", "dynamo")),
]


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


# The table's figures taken at each system's best thread count: rates and memory.
BEST_OF = ("applied", "applied_apart", "q16_rps", "bpp")
# Latency at one thread count, never best-of: (key, label, systems).
LATENCY = [
    ("q16_p50", "closed loop, 16 conns: p50 µs", ("kvix", "dynamo", "hello", "ghello")),
    ("q16_p99", "closed loop, 16 conns: p99 µs", ("kvix", "dynamo", "hello", "ghello")),
    ("q16_rps", "closed loop, 16 conns: req/s", ("kvix", "dynamo", "hello", "ghello")),
    ("q1_p50", "closed loop, 1 conn: p50 µs", ("kvix", "dynamo", "hello", "ghello")),
    ("q1_p99", "closed loop, 1 conn: p99 µs", ("kvix", "dynamo", "hello", "ghello")),
    ("o_p50", "open loop: p50 µs", ("kvix", "dynamo", "hello", "ghello")),
    ("o_p99", "open loop: p99 µs", ("kvix", "dynamo", "hello", "ghello")),
    ("o_p999", "open loop: p99.9 µs", ("kvix", "dynamo", "hello", "ghello")),
    ("oi_p50", "open loop, interleaved with Dynamo: p50 µs", ("kvix", "dynamo")),
    ("oi_p99", "open loop, interleaved with Dynamo: p99 µs", ("kvix", "dynamo")),
    ("oi_p999", "open loop, interleaved with Dynamo: p99.9 µs", ("kvix", "dynamo")),
    ("conn_p99_max", "16 conns: slowest connection's p99 µs", ("kvix", "dynamo", "hello", "ghello")),
    ("conn_spread", "16 conns: slowest ÷ median connection's p99", ("kvix", "dynamo", "hello", "ghello")),
]
# Where the tail targets apply: kvix ÷ Dynamo at most this, at each thread count.
TAIL_TARGET = {"q16_p99": 0.5, "o_p99": 0.5, "oi_p99": 0.5}


def phase(report, connections, open_loop=False):
    for q in (report or {}).get("queries", []):
        if q["connections"] == connections and (q["rate"] > 0) == open_loop:
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


def open_figures(o, prefix):
    """p50/p99/p99.9 of an open-loop phase under `prefix`; None where the system did
    not keep up (requests never sent): its latency would be that of a queue that only
    grows."""
    kept_up = o["completed"] and not o.get("unsent")
    return {
        f"{prefix}_{k}": (o[f"{k}_us"] if kept_up else None) for k in ("p50", "p99", "p999")
    }


def pair_figures(report, filled, configs, threads):
    """The interleaved open loop (compare.sh run_pair), into each system's figures at
    that thread count: kvix's phase is the one that loaded the report's --url, which
    comes first.
    `filled`: each system's event report, where kept; a system whose report says its
    index was not filled (a sentinel not seen) has no figures."""
    queries = (report or {}).get("queries", [])
    for q in queries:
        if q["rate"] <= 0:
            continue
        system = "kvix" if q.get("target") == queries[0].get("target") else "dynamo"
        f = filled.get(system)
        if f is not None and not ((f.get("events") or {}).get("publish") or {}).get(
            "all_sentinels_seen"
        ):
            continue
        c = configs.setdefault(f"{system}-t{threads}", {})
        c.update(open_figures(q, "oi"))
        c["errors"] = c.get("errors", 0) + q["errors"]


def one_config(events, query, log, open_report=None, apart=None, apart_log=None):
    """The figures of one (system, threads) in one run; None where not measured."""
    out = {"log_failures": lost_events(log)}
    if apart and apart.get("events"):
        # Engines seeding their hashes apart: the rate, and how many events the
        # server's log says it could not index (Dynamo 1.6.1 loses some such stores).
        e = apart["events"]
        out["applied_apart"] = e["blocks_applied_per_sec"]
        out["apart_sentinels_seen"] = e["publish"]["all_sentinels_seen"]
        out["apart_log_failures"] = lost_events(apart_log)
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
    if q16 and q16["completed"]:
        out["q16_p50"] = q16["p50_us"]
        if q16.get("conn_p99_max_us"):
            out["conn_p99_max"] = q16["conn_p99_max_us"]
            med = q16.get("conn_p99_median_us")
            out["conn_spread"] = q16["conn_p99_max_us"] / med if med else None
    if q1:
        out["q1_p50"] = q1["p50_us"] if q1["completed"] else None
        out["q1_p99"] = q1["p99_us"] if q1["completed"] else None
        out["errors"] = out.get("errors", 0) + q1["errors"]
    o = phase(open_report, 16, open_loop=True)
    if o:
        out["o_rate"] = o["rate"]
        out["o_rps"] = o["achieved_rps"]
        out.update(open_figures(o, "o"))
        out["errors"] = out.get("errors", 0) + o["errors"]
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
            configs[name] = one_config(
                ev,
                load(qf),
                os.path.join(wdir, f"{name}.log"),
                load(os.path.join(wdir, f"{name}-open.json")),
                load(os.path.join(wdir, f"{name}-events-apart.json")),
                os.path.join(wdir, f"{name}-apart.log"),
            )
        for pf in sorted(glob.glob(os.path.join(wdir, "pair-t*-open.json"))):
            m = re.match(r"pair-t(\d+)-open\.json$", os.path.basename(pf))
            if m:
                t = int(m.group(1))
                filled = {
                    s: load(os.path.join(wdir, f"pair-{s}-t{t}-events.json"))
                    for s in ("kvix", "dynamo")
                }
                pair_figures(load(pf), filled, configs, t)
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
    if key == "conn_spread":
        return f"{v:.2f}×"
    if key in ("applied", "applied_apart", "q16_rps"):
        return f"{v / 1e6:.2f}M" if v >= 1e6 else f"{v / 1e3:.1f}k"
    if key == "bpp":
        return f"{v:.1f}"
    return f"{v:,.0f}"


def median_range(key, xs):
    """A cell: the median of the runs' figures, then their range if several."""
    med = statistics.median(xs)
    rng = f" ({fmt(key, min(xs))}–{fmt(key, max(xs))})" if len(xs) > 1 else ""
    return f"{fmt(key, med)}{rng}"


def spread(xs, fn=lambda x: f"{x:.2f}×"):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "—"
    med = statistics.median(xs)
    if len(xs) == 1:
        return f"**{fn(med)}**"
    return f"**{fn(med)}** ({fn(min(xs))}–{fn(max(xs))})"


def threads_of(per_run):
    return sorted({int(n.rsplit("-t", 1)[1]) for c in per_run for n in c})


def has_system(per_run, system):
    """Whether any of these runs' configurations is of `system`."""
    return any(n.rsplit("-t", 1)[0] == system for c in per_run for n in c)


def columns(per_run, floors):
    """The systems a table shows, and its ratio columns as (numerator, denominator):
    glommio-hello's column, and with `floors` the hellos ÷ Dynamo (what a server that
    does no work reaches against Dynamo on this machine), only in runs that have it."""
    ghello = has_system(per_run, "ghello")
    systems = ["kvix", "dynamo", "hello"] + (["ghello"] if ghello else [])
    ratios = [("kvix", "dynamo"), ("kvix", "hello")]
    if ghello:
        ratios.append(("kvix", "ghello"))
        if floors:
            ratios += [("hello", "dynamo"), ("ghello", "dynamo")]
    return systems, ratios


def header(systems, ratios):
    name = lambda s: SYSTEMS[s].replace(" 1.6.1", "") if s == "dynamo" else SYSTEMS[s]
    cols = [SYSTEMS[s] for s in systems] + [f"{name(a)} / {name(b)}" for a, b in ratios]
    return ["| metric | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]


def latency_tables(per_run):
    """Per thread count: each system's latency figures (median over runs, range),
    kvix ÷ each other system per run, and whether the tail targets held in every run;
    with glommio-hello, also each hello ÷ Dynamo per run (the machine's floor)."""
    lines = []
    shown, pairs = columns(per_run, floors=True)
    for t in threads_of(per_run):
        lines += [f"### --threads {t}", ""] + header(shown, pairs)
        for key, label, systems in LATENCY:
            vals = {}
            cells = []
            for s in shown:
                v = [c.get(f"{s}-t{t}", {}).get(key) if s in systems else None for c in per_run]
                vals[s] = v
                got = [x for x in v if x is not None]
                if not got:
                    cells.append("—")
                    continue
                cells.append(median_range(key, got))
            ratios = []
            for num, other in pairs:
                rs = [k / o if k is not None and o else None for k, o in zip(vals[num], vals[other])]
                cell = spread(rs)
                target = TAIL_TARGET.get(key)
                if (num, other) == ("kvix", "dynamo") and target is not None and any(r is not None for r in rs):
                    held = all(r is not None and r <= target for r in rs)
                    cell += f" {'✓' if held else '✗'} ≤ {target}× in every run"
                ratios.append(cell)
            lines.append(f"| {label} | " + " | ".join(cells + ratios) + " |")
        rates = sorted({c.get(f"kvix-t{t}", {}).get("o_rate") for c in per_run} - {None})
        if rates:
            lines += ["", f"Open loop: {', '.join(f'{r:,.0f}' for r in rates)} req/s over 16 connections, latency from each request's intended send time."]
        lines.append("")
    return lines


# The before-and-after table (compare.sh --before): what a change may not move.
BEFORE_AFTER = [
    ("applied", "events: blocks applied/s"),
    ("applied_apart", "events, engine hashes apart: blocks applied/s"),
    ("bpp", "settled RSS bytes / live (block, worker)"),
    ("q16_rps", "closed loop, 16 conns: req/s"),
    ("q16_p99", "closed loop, 16 conns: p99 µs"),
    ("q1_p50", "closed loop, 1 conn: p50 µs"),
    ("o_p99", "open loop: p99 µs"),
]


def before_after(per_run):
    """Per thread count: kvix against the --before build, same runs, ratio per run."""
    lines = []
    for t in threads_of(per_run):
        if not any(f"before-t{t}" in c for c in per_run):
            continue
        lines += [
            f"#### --threads {t}: before and after",
            "",
            "| metric | after (kvix) | before | after / before |",
            "|---|---|---|---|",
        ]
        for key, label in BEFORE_AFTER:
            after = [c.get(f"kvix-t{t}", {}).get(key) for c in per_run]
            before = [c.get(f"before-t{t}", {}).get(key) for c in per_run]
            cells = [
                median_range(key, got) if got else "—"
                for got in ([x for x in after if x is not None], [x for x in before if x is not None])
            ]
            ratio = spread([a / b if a is not None and b else None for a, b in zip(after, before)])
            lines.append(f"| {label} | {cells[0]} | {cells[1]} | {ratio} |")
        lines.append("")
    return lines


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
        f"{len(runs)} run(s). Each cell: median over runs (range). Latency is reported per "
        "thread count, never best-of; throughput, events and memory at each system's best "
        "thread count (1 or 2) for that metric in that run, the count chosen after the value "
        "(`t1`, `t2`). Ratios are kvix ÷ the other, per run: above 1 is better for kvix on "
        "rates, below 1 on latency and memory. Event streams are vLLM's wire with a nil dp-rank "
        "element and one engine hash per block on every worker, for both systems (what Dynamo "
        "1.6.1 needs to index every event); `engine hashes apart` replays the same load on a "
        "fresh server with one engine hash per worker (vLLM's default); tokio-hello answers a constant body of the mean size "
        "of kvix's replies (`reply bytes`). `hit %`: replies with a non-empty `scores`.",
    ]
    if has_system([c for r in runs for c in r["workloads"].values()], "ghello"):
        lines[-1] += (
            " glommio-hello (kvix-hello) answers the same body on kvix's runtime, with no index."
            " A hello ÷ Dynamo is what a server that does no work reaches against Dynamo: on this"
            " machine (tokio-hello), or on kvix's runtime (glommio-hello)."
        )
    workloads = sorted({w for r in runs for w in r["workloads"]}, key=lambda w: (w != "trace", w))
    for wl in workloads:
        per_run = [r["workloads"].get(wl, {}) for r in runs]
        lines += ["", f"## {wl}", ""]
        lines += latency_tables(per_run)
        lines += [
            "",
            "Throughput, events and memory, each system at its best thread count:",
            "",
        ]
        shown, pairs = columns(per_run, floors=False)
        lines += header(shown, pairs)
        for key, label, higher, systems in METRICS:
            if key not in BEST_OF:
                continue
            cells, bests = [], {}
            for s in shown:
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
                cells.append(f"{median_range(key, vals)} {'/'.join(threads)}")
            ratios = []
            for num, other in pairs:
                if num not in bests or other not in bests:
                    ratios.append("")
                    continue
                rs = [
                    k[0] / o[0] if k and o and o[0] else None
                    for k, o in zip(bests[num], bests[other])
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
            if any(c.get("apart_sentinels_seen") is False for c in cs):
                checks.append("hashes apart: sentinels missed")
            lost = [c.get("apart_log_failures") for c in cs if c.get("apart_log_failures")]
            if lost:
                checks.append(f"hashes apart: {max(lost)} events not indexed (log)")
            hit, rb = med("hit_rate"), med("reply_bytes")
            lines.append(
                f"| {SYSTEMS.get(sysname, sysname)} | {t} | {fmt('applied', med('applied'))} "
                f"| {fmt('bpp', med('bpp'))} | {fmt('q16_rps', med('q16_rps'))} "
                f"| {fmt('q16_p99', med('q16_p99'))} | {fmt('q1_p50', med('q1_p50'))} "
                f"| {'—' if hit is None else f'{100 * hit:.0f}'} | {'—' if rb is None else f'{rb:.0f}'} "
                f"| {', '.join(checks) or 'ok'} |"
            )
        ba = before_after(per_run)
        if ba:
            lines += ["", "### Before and after (`--before`), each run's pair side by side", ""] + ba
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
            if key == "applied_apart":
                continue
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
