//! `kvix-load slots`: closed-loop load on a slot tracker (Dynamo's standalone slot
//! tracker API: kvix's `--slot-tracker-port` or Dynamo's own).
//!
//! Owns registering the workers, the load threads and the figures. Each thread
//! books a request (`/add`) and frees it (`/free`), one pair at a time, on its own
//! keep-alive connection; prompts open with one of a few shared prefixes, so
//! active requests share blocks as a router's do. `--potential` loads
//! `/potential_loads` instead, with `--active` requests left booked.

use crate::http::{Conn, Target, post};
use serde_json::json;
use std::time::{Duration, Instant};

/// What one run measured.
#[derive(Debug, Default, serde::Serialize)]
pub struct SlotsReport {
    pub url: String,
    pub mode: &'static str,
    pub connections: usize,
    pub seconds: f64,
    /// Pairs (`/add` + `/free`) or `/potential_loads` calls completed.
    pub completed: u64,
    pub per_second: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub errors: u64,
}

#[derive(Clone)]
pub struct SlotsArgs {
    pub url: String,
    pub model: String,
    pub workers: u64,
    pub blocks: usize,
    pub connections: usize,
    pub duration: f64,
    pub potential: bool,
    pub active: usize,
    /// Leave the --active requests booked at the end (for a later /query --loads).
    pub keep_active: bool,
}

fn hashes(prefix: u64, unique: u64, blocks: usize) -> Vec<i64> {
    // Half the prompt is one of 8 shared prefixes, the rest the request's own.
    (0..blocks as u64)
        .map(|b| {
            let x = if b < blocks as u64 / 2 {
                (prefix << 32) | b
            } else {
                (unique << 20) ^ b ^ (1 << 62)
            };
            x as i64
        })
        .collect()
}

fn add_body(a: &SlotsArgs, id: &str, n: u64) -> Vec<u8> {
    json!({"model_name": a.model, "request_id": id, "worker_id": n % a.workers,
           "dp_rank": 0, "sequence_hashes": hashes(n % 8, n, a.blocks), "new_isl_tokens": a.blocks * 16})
    .to_string()
    .into_bytes()
}

/// Register the workers (a 409 from an earlier run is fine), run the load, free
/// what it left booked.
pub fn run(a: &SlotsArgs) -> Result<SlotsReport, String> {
    let target = Target::parse(&a.url)?;
    for w in 0..a.workers {
        let body = json!({"worker_id": w, "model_name": a.model, "block_size": 16, "dp_start": 0, "dp_size": 1});
        let (st, text) = post(&target, "/register", &body).map_err(|e| e.to_string())?;
        if st != 201 && st != 409 {
            return Err(format!("/register: {st} {text}"));
        }
    }
    let mut c = Conn::new(&target);
    for i in 0..a.active as u64 {
        let raw = target.request("POST", "/add", &add_body(a, &format!("active-{i}"), i));
        // 409: booked by an earlier run with --keep-active.
        match c.send(&raw) {
            Ok(201 | 409) => {}
            r => return Err(format!("/add: {r:?}")),
        }
    }
    let deadline = Instant::now() + Duration::from_secs_f64(a.duration);
    let t0 = Instant::now();
    let threads: Vec<_> = (0..a.connections)
        .map(|t| {
            let (target, a) = (target.clone(), a.clone());
            std::thread::spawn(move || worker(&target, &a, t, deadline))
        })
        .collect();
    let mut lat = Vec::new();
    let mut errors = 0;
    for h in threads {
        let (l, e) = h.join().map_err(|_| "a load thread panicked")?;
        lat.extend(l);
        errors += e;
    }
    let seconds = t0.elapsed().as_secs_f64();
    for i in 0..a.active as u64 * u64::from(!a.keep_active) {
        let body = json!({"model_name": a.model, "request_id": format!("active-{i}")});
        let _ = c.send(&target.request("POST", "/free", body.to_string().as_bytes()));
    }
    lat.sort_unstable();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .map_or(0.0, |d: &Duration| d.as_secs_f64() * 1e6)
    };
    Ok(SlotsReport {
        url: a.url.clone(),
        mode: if a.potential {
            "potential_loads"
        } else {
            "add+free"
        },
        connections: a.connections,
        seconds,
        completed: lat.len() as u64,
        per_second: lat.len() as f64 / seconds,
        p50_us: pct(0.5),
        p99_us: pct(0.99),
        errors,
    })
}

/// One connection's loop: pairs (or potential-load calls) until `deadline`.
fn worker(target: &Target, a: &SlotsArgs, t: usize, deadline: Instant) -> (Vec<Duration>, u64) {
    let mut c = Conn::new(target);
    let (mut lat, mut errors) = (Vec::new(), 0);
    let mut n = (t as u64) << 40;
    while Instant::now() < deadline {
        n += 1;
        let start = Instant::now();
        let ok = if a.potential {
            let body = json!({"model_name": a.model, "sequence_hashes": hashes(n % 8, n, a.blocks),
                              "new_isl_tokens": a.blocks * 16});
            let raw = target.request("POST", "/potential_loads", body.to_string().as_bytes());
            matches!(c.send(&raw), Ok(200))
        } else {
            let id = format!("load-{t}-{n}");
            let add = target.request("POST", "/add", &add_body(a, &id, n));
            let free = json!({"model_name": a.model, "request_id": id});
            let free = target.request("POST", "/free", free.to_string().as_bytes());
            matches!(c.send(&add), Ok(201)) && matches!(c.send(&free), Ok(200))
        };
        if ok {
            lat.push(start.elapsed());
        } else {
            errors += 1;
        }
    }
    (lat, errors)
}
