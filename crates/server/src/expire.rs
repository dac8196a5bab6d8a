//! Active expiry and the other background steps, on worker 0's tick (a
//! method of `Worker`, whose keyspace it uses; the work itself is in
//! [`crate::housekeep`]). A key read after its time is treated as gone
//! wherever it is read (`keyspace`); these steps reclaim the keys nobody
//! reads, and the pieces of large collections freed lazily.

use crate::housekeep;
use crate::worker::Worker;
use std::time::{Duration, Instant};

/// How long a free-list entry waits before the lazy free takes it: by then
/// the worker that wrote it has committed its batch (a worker commits
/// before it replies, within its poll loop's turn), so no piece is removed
/// durably while the removal of its collection's head might not be.
pub(crate) const LAZY_FREE_DELAY: Duration = Duration::from_secs(1);

impl Worker {
    /// Redis's active expiry cycle, `hz` times a second: rounds of keys
    /// sampled from the TTL index, for at most a quarter of the tick period
    /// (Redis's 25% CPU bound); then, in what is left of that budget (at
    /// least one step each), the start pass and the lazy free.
    pub(crate) fn active_expire(&mut self) {
        let period = Duration::from_millis(1000 / self.settings.hz.max(1));
        let t0 = Instant::now();
        let deadline = t0 + period / 4;
        // A database left without keys with a TTL starts its `avg_ttl` over,
        // as Redis's does.
        for db in 0..=u8::MAX {
            if let Some((_, 0)) = self.sh.counts.get(db) {
                self.sh.counts.reset_avg_ttl(db);
            }
        }
        let sh = self.sh.clone();
        // Nothing expires actively while clients are paused (Redis 7.0).
        if sh
            .hk
            .active_expire
            .load(std::sync::atomic::Ordering::Relaxed)
            && !sh.hk.paused()
        {
            housekeep::expire_cycle(&sh, &mut self.ks, deadline);
        }
        // `expired` notifications of the keys it deleted.
        crate::notify::flush_pending(&sh, &mut self.ks);
        if !sh.hk.indexed() {
            let step = Instant::now() + Duration::from_millis(1);
            if let Err(e) = housekeep::start_pass(
                &sh,
                &mut self.ks,
                &mut self.expire_cursor,
                Some(step.max(deadline)),
            ) {
                eprintln!("ember: the start pass over the keyspace failed: {e:?}");
            }
        }
        let step = Instant::now() + Duration::from_millis(1);
        if let Err(e) =
            housekeep::lazy_free_step(&sh, &mut self.ks, Some(step.max(deadline)), LAZY_FREE_DELAY)
        {
            eprintln!("ember: freeing a deleted collection's pieces failed: {e:?}");
        }
    }
}
