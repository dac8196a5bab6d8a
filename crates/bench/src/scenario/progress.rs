//! Progress of a scenario on stderr: a bar when stderr is a terminal, one plain
//! line per finished run otherwise (CI logs).

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

pub struct Progress {
    name: &'static str,
    bar: Option<ProgressBar>,
    total: u64,
    done: u64,
    current: String,
    started: Instant,
}

impl Progress {
    pub fn new(name: &'static str) -> Progress {
        Progress {
            name,
            bar: None,
            total: 0,
            done: 0,
            current: String::new(),
            started: Instant::now(),
        }
    }

    /// Announces `total` runs.
    pub fn plan(&mut self, total: u64) {
        self.total = total;
        self.done = 0;
        if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(total);
            let style = ProgressStyle::with_template(
                "{prefix} [{bar:30}] {pos}/{len} {elapsed_precise} {wide_msg}",
            )
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar.set_prefix(self.name);
            // Elapsed time moves also during a long run.
            bar.enable_steady_tick(Duration::from_millis(250));
            self.bar = Some(bar);
        }
    }

    /// A run begins.
    pub fn start(&mut self, what: impl Into<String>) {
        self.current = what.into();
        self.started = Instant::now();
        if let Some(b) = &self.bar {
            b.set_message(self.current.clone());
        }
    }

    /// The current run ended with `result` (a short summary).
    pub fn done(&mut self, result: &str) {
        self.done += 1;
        let line = format!(
            "{} [{}/{}] {}: {result} ({:.1} s)",
            self.name,
            self.done,
            self.total,
            self.current,
            self.started.elapsed().as_secs_f64()
        );
        match &self.bar {
            Some(b) => {
                b.println(line);
                b.inc(1);
            }
            None => eprintln!("{line}"),
        }
    }

    /// A remark that is not a run (e.g. a knob a benchmark cannot take).
    pub fn note(&self, msg: &str) {
        let line = format!("{}: {msg}", self.name);
        match &self.bar {
            Some(b) => b.println(line),
            None => eprintln!("{line}"),
        }
    }

    pub fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }

    /// Leaves the bar where it stopped (after an error).
    pub fn abandon(&mut self) {
        if let Some(b) = self.bar.take() {
            b.abandon();
        }
    }
}
