//! Active expiry: on worker 0's tick, a step that walks the next slice of
//! the keyspace and deletes the keys whose time has passed (a method of
//! `Worker`, whose keyspace and scan cursor it uses). A key read after its
//! time is treated as gone wherever it is read (`keyspace`); this step
//! reclaims the keys nobody reads.

use crate::worker::Worker;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

impl Worker {
    /// Redis's active expiry, adapted: keys with a TTL are not indexed
    /// separately, so each tick walks the next slice of the keyspace (a scan
    /// cursor that wraps around) and deletes what has expired, for at most
    /// ~25% of the tick period; a slice where a quarter or more of the keys had
    /// expired is followed at once by another.
    pub(crate) fn active_expire(&mut self) {
        let budget = Duration::from_millis(250 / self.settings.hz.max(1));
        let t0 = Instant::now();
        // A database left without keys with a TTL starts its `avg_ttl` over,
        // as Redis's does.
        for db in 0..=u8::MAX {
            if let Some((_, 0)) = self.sh.counts.get(db) {
                self.sh.counts.reset_avg_ttl(db);
            }
        }
        let mut keys = Vec::new();
        loop {
            keys.clear();
            let next = match self.ks.sess.scan(self.expire_cursor, 200, &mut keys) {
                Ok(n) => n,
                Err(e) => {
                    eprintln!("ember: active expiry scan failed: {e}");
                    return;
                }
            };
            self.expire_cursor = next;
            let now = crate::keyspace::now_ms();
            let mut expired = 0;
            let seen = keys.len();
            // TTLs left on the live keys seen, per database: (sum, count);
            // i128, as a TTL may lie near the end of time (PXAT).
            let mut ttls: BTreeMap<u8, (i128, i64)> = BTreeMap::new();
            for k in &keys {
                if k.first() == Some(&crate::keyspace::PIECE_PREFIX) {
                    continue;
                }
                match self.ks.lookup_raw(k, now) {
                    Ok((None, true)) => {
                        let _g = self.sh.stripes.lock(k);
                        if let Ok((None, true)) = self.ks.lookup_raw(k, now) {
                            if self.ks.lookup_expiring(k, now).is_ok() {
                                expired += 1;
                            }
                        }
                    }
                    Ok((Some(h), false)) => {
                        if let (Some(t), Some(&db)) = (h.expire, k.first()) {
                            let e = ttls.entry(db).or_default();
                            e.0 += i128::from(t - now);
                            e.1 += 1;
                        }
                    }
                    _ => {}
                }
            }
            for (db, (sum, n)) in ttls {
                self.sh.counts.sample_ttls(db, sum, n);
            }
            if next == 0 || seen == 0 || expired * 4 < seen || t0.elapsed() >= budget {
                return;
            }
        }
    }
}
