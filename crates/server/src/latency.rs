//! The latency monitor (Redis's `latency.c`, for the events Ember has):
//! with `latency-monitor-threshold` N > 0 ms, a command that took at least
//! N ms adds a sample to the `command` event (`fast-command` for commands
//! flagged `fast`): one sample per second per event (the second's largest),
//! the last 160 kept, with the event's all-time maximum. LATENCY LATEST,
//! HISTORY, RESET and HELP answer as Redis; DOCTOR and GRAPH (Redis's
//! report texts and ASCII graphs) and HISTOGRAM are refused with a clear
//! error. The per-command cost is the slow log's: one relaxed load.

use proto::Reply;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

const SAMPLES: usize = 160;

#[derive(Default)]
struct Series {
    /// (Unix seconds, milliseconds), oldest first.
    samples: std::collections::VecDeque<(i64, u64)>,
    max: u64,
}

#[derive(Default)]
pub struct Latency {
    /// `latency-monitor-threshold` in ms (0: off).
    threshold: AtomicU64,
    events: Mutex<BTreeMap<&'static str, Series>>,
}

impl Latency {
    pub fn new(threshold_ms: u64) -> Latency {
        let l = Latency::default();
        l.threshold.store(threshold_ms, Ordering::Relaxed);
        l
    }

    pub fn configure(&self, threshold_ms: u64) {
        self.threshold.store(threshold_ms, Ordering::Relaxed);
    }

    fn events(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, Series>> {
        self.events.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A command that took `micros`: sampled when at the threshold.
    #[inline]
    pub fn command(&self, fast: bool, micros: u64) {
        let t = self.threshold.load(Ordering::Relaxed);
        let ms = micros / 1000;
        if t == 0 || ms < t {
            return;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        self.add(if fast { "fast-command" } else { "command" }, now, ms);
    }

    fn add(&self, event: &'static str, now: i64, ms: u64) {
        let mut e = self.events();
        let s = e.entry(event).or_default();
        s.max = s.max.max(ms);
        if let Some(last) = s.samples.back_mut() {
            if last.0 == now {
                last.1 = last.1.max(ms);
                return;
            }
        }
        if s.samples.len() == SAMPLES {
            s.samples.pop_front();
        }
        s.samples.push_back((now, ms));
    }

    /// LATENCY LATEST.
    pub fn latest(&self) -> Reply {
        Reply::Array(
            self.events()
                .iter()
                .filter_map(|(name, s)| {
                    let (t, ms) = *s.samples.back()?;
                    Some(Reply::Array(vec![
                        Reply::Bulk(name.as_bytes().to_vec()),
                        Reply::Integer(t),
                        Reply::Integer(ms as i64),
                        Reply::Integer(s.max as i64),
                    ]))
                })
                .collect(),
        )
    }

    /// LATENCY HISTORY `event`.
    pub fn history(&self, event: &[u8]) -> Reply {
        let e = self.events();
        let s = e
            .iter()
            .find(|(n, _)| n.as_bytes() == event)
            .map(|(_, s)| s);
        Reply::Array(
            s.into_iter()
                .flat_map(|s| s.samples.iter())
                .map(|&(t, ms)| Reply::Array(vec![Reply::Integer(t), Reply::Integer(ms as i64)]))
                .collect(),
        )
    }

    /// LATENCY RESET: the named events (all when none), how many existed.
    pub fn reset(&self, events: &[Vec<u8>]) -> usize {
        let mut e = self.events();
        if events.is_empty() {
            let n = e.len();
            e.clear();
            return n;
        }
        let mut n = 0;
        for name in events {
            let key = e.keys().find(|k| k.as_bytes() == name.as_slice()).copied();
            if let Some(k) = key {
                e.remove(k);
                n += 1;
            }
        }
        n
    }

    /// Whether `event` has samples (GRAPH's error otherwise).
    pub fn has(&self, event: &[u8]) -> bool {
        self.events().keys().any(|k| k.as_bytes() == event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_per_second_bounded_with_max() {
        let l = Latency::new(10);
        l.command(false, 5_000);
        assert_eq!(l.latest(), Reply::Array(vec![]));
        l.add("command", 100, 20);
        l.add("command", 100, 50);
        l.add("command", 100, 30);
        l.add("command", 101, 15);
        assert_eq!(
            l.history(b"command"),
            Reply::Array(vec![
                Reply::Array(vec![Reply::Integer(100), Reply::Integer(50)]),
                Reply::Array(vec![Reply::Integer(101), Reply::Integer(15)]),
            ])
        );
        for t in 0..200 {
            l.add("command", 200 + t, 11);
        }
        let Reply::Array(h) = l.history(b"command") else {
            panic!()
        };
        assert_eq!(h.len(), SAMPLES);
        assert_eq!(
            l.latest(),
            Reply::Array(vec![Reply::Array(vec![
                Reply::Bulk(b"command".to_vec()),
                Reply::Integer(399),
                Reply::Integer(11),
                Reply::Integer(50),
            ])])
        );
        assert_eq!(l.reset(&[b"nosuch".to_vec(), b"command".to_vec()]), 1);
        assert_eq!(l.reset(&[]), 0);
    }
}
