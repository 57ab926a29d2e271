//! What one executor (core 0) does beside serving: snapshots, the lifecycle
//! (signals, readiness, the watchdog), and every core's heartbeat.
//!
//! Never blocks an executor: snapshot files are written off it.

use super::*;
/// Export the state and write it as a snapshot. Ordering, encoding and file I/O run
/// off the executor, which keeps serving. Returns when the file is durable.
async fn write_snapshot(core: &Core, path: std::path::PathBuf) {
    let t0 = Instant::now();
    let export =
        match crate::recovery::export::export(core, core.app.ingest().clone(), core.app.registry())
            .await
        {
            Ok(s) => s,
            Err(e) => {
                core.app
                    .recovery_stats()
                    .snapshot_failures
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::error!("snapshot not written: {e}");
                return;
            }
        };
    let export_ms = t0.elapsed().as_millis() as u64;
    let r = core
        .offload(move || {
            let t = Instant::now();
            let state = export.into_state();
            let blocks = state.blocks();
            let image = crate::recovery::snapshot::encode(&state);
            drop(state);
            let encode_ms = t.elapsed().as_millis() as u64;
            crate::recovery::snapshot::write(&path, &image)
                .map(|_| (path, image.len(), encode_ms, blocks))
        })
        .await;
    let stats = core.app.recovery_stats();
    match r {
        Ok((path, bytes, encode_ms, blocks)) => {
            stats
                .snapshots_written
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::info!(
                path = %path.display(),
                blocks,
                bytes,
                export_ms,
                encode_ms,
                took_ms = t0.elapsed().as_millis() as u64,
                "snapshot written"
            );
        }
        Err(e) => {
            stats
                .snapshot_failures
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::error!("snapshot not written: {e}");
        }
    }
}

/// On core 0: periodic snapshots, SIGTERM/SIGINT (Draining, a final snapshot, exit
/// 0), SIGHUP (ignored, logged) and systemd's watchdog. No snapshot is taken before
/// startup recovery finished (it would be emptier than the one it replaces).
pub(super) async fn lifecycle_loop(core: Rc<Core>) {
    let life = core.app.lifecycle();
    let cfg = core.app.snapshot_config().cloned();
    let mut next = cfg
        .as_ref()
        .filter(|c| !c.interval.is_zero())
        .map(|c| Instant::now() + c.interval);
    let watchdog = crate::lifecycle::watchdog_interval();
    let mut next_ping = Instant::now();
    loop {
        glommio::timer::sleep(Duration::from_millis(20)).await;
        let recovered = life.phase().serves_data();
        if life.terminate_requested() {
            life.drain();
            tracing::info!("draining: /ready answers 503");
            if let Some(c) = &cfg
                && recovered
            {
                write_snapshot(&core, c.path.clone()).await;
            }
            tracing::info!("terminating");
            std::process::exit(0);
        }
        if life.take_hangup() {
            tracing::info!(
                "SIGHUP ignored (kvix has no configuration to reload; logs go to stderr)"
            );
        }
        if let Some(every) = watchdog
            && Instant::now() >= next_ping
        {
            // Only when every core's executor ran its heartbeat recently: a wedged core
            // stops the keep-alives and systemd restarts the service.
            if life.all_cores_alive(life.stall_after().min(every / 2)) {
                let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
            }
            next_ping = Instant::now() + every / 4;
        }
        if let (Some(c), Some(at)) = (&cfg, next)
            && life.phase() == Phase::Ready
            && Instant::now() >= at
        {
            write_snapshot(&core, c.path.clone()).await;
            next = Some(Instant::now() + c.interval);
        }
    }
}

/// Every core: prove the executor runs (for `/ready` and the watchdog). A timer
/// task, so it beats only while the executor gets round to its tasks.
pub(super) async fn heartbeat_loop(core: Rc<Core>) {
    let every = core.app.lifecycle().heartbeat_every();
    loop {
        core.app.lifecycle().heartbeat(core.id.0);
        glommio::timer::sleep(every).await;
    }
}
