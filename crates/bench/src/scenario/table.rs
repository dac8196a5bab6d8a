//! The CSV a scenario writes: the labels every row carries, then the scenario's
//! own measured columns.

use super::{emulation, BenchResult, Ctx, COMMIT};
use std::io::Write;
use std::path::Path;

/// The columns every row starts with.
pub const COMMON: &[&str] = &[
    "scenario",
    "mode",
    "machine_cpu",
    "machine_cores",
    "commit",
    "engine",
    "variant",
    "durability",
    "strategy",
    "fence_ns",
    "read_ns",
    "emulation",
    "threads",
];

/// What a row measured: the store (engine and variant), how writes are made
/// durable (durability mode and persistence strategy), the emulated fence
/// latency and the threads.
#[derive(Clone, Debug)]
pub struct Labels {
    pub engine: String,
    pub variant: String,
    /// pmem, msync, volatile, or Redis's rdb / aof.
    pub durability: String,
    /// clwb, clflushopt, clflush, fence-only, msync, none, or Redis's fsync policy.
    pub strategy: String,
    pub fence_ns: u64,
    /// Emulated extra ns per index node read (0 where the knob does not apply).
    pub read_ns: u64,
    pub threads: usize,
}

impl Labels {
    /// The labels of an `ember bench engine --json` result: its `engine`
    /// (`bullet-st` is engine bullet, variant st; `volatile` has variant none)
    /// and its `durability` (a strategy name, or volatile).
    pub fn of_engine(v: &serde_json::Value) -> BenchResult<Labels> {
        let name = super::text(v, "engine")?;
        let (engine, variant) = match name.split_once('-') {
            Some((e, v)) => (e.to_string(), v.to_string()),
            None => (name.clone(), "none".to_string()),
        };
        let strategy = super::text(v, "durability")?;
        let durability = match strategy.as_str() {
            "volatile" => "volatile",
            "msync" => "msync",
            _ => "pmem",
        };
        Ok(Labels {
            engine,
            variant,
            durability: durability.into(),
            strategy: if durability == "volatile" {
                "none".into()
            } else {
                strategy
            },
            fence_ns: super::num(v, "fence_ns")? as u64,
            read_ns: v.get("read_ns").and_then(|x| x.as_u64()).unwrap_or(0),
            threads: super::num(v, "threads")? as usize,
        })
    }
}

/// Rows of one scenario.
pub struct Table {
    scenario: &'static str,
    mode: &'static str,
    cpu: String,
    cores: usize,
    columns: Vec<&'static str>,
    rows: Vec<(Labels, Vec<String>)>,
}

impl Table {
    /// A table whose rows have the common columns and then `columns`.
    pub fn new(ctx: &Ctx, columns: &[&'static str]) -> Table {
        Table {
            scenario: ctx.name,
            mode: ctx.mode(),
            cpu: ctx.machine.cpu.clone(),
            cores: ctx.machine.cores,
            columns: columns.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row: one value per measured column.
    pub fn push(&mut self, labels: &Labels, values: Vec<String>) {
        assert_eq!(
            values.len(),
            self.columns.len(),
            "{}: a row needs one value per column {:?}",
            self.scenario,
            self.columns
        );
        self.rows.push((labels.clone(), values));
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The CSV text (RFC 4180 quoting).
    pub fn to_csv(&self) -> String {
        let mut out = String::new();
        let header: Vec<&str> = COMMON.iter().chain(&self.columns).copied().collect();
        line(&mut out, header.iter().copied());
        for (l, values) in &self.rows {
            let common = [
                self.scenario.to_string(),
                self.mode.to_string(),
                self.cpu.clone(),
                self.cores.to_string(),
                COMMIT.to_string(),
                l.engine.clone(),
                l.variant.clone(),
                l.durability.clone(),
                l.strategy.clone(),
                l.fence_ns.to_string(),
                l.read_ns.to_string(),
                emulation(l.fence_ns, l.read_ns),
                l.threads.to_string(),
            ];
            line(&mut out, common.iter().chain(values).map(String::as_str));
        }
        out
    }

    pub fn write(&self, path: &Path) -> BenchResult<()> {
        let mut f = std::fs::File::create(path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        f.write_all(self.to_csv().as_bytes())
            .map_err(|e| format!("cannot write {}: {e}", path.display()))
    }
}

fn line<'a>(out: &mut String, fields: impl Iterator<Item = &'a str>) {
    for (i, f) in fields.enumerate() {
        if i > 0 {
            out.push(',');
        }
        if f.contains([',', '"', '\n', '\r']) {
            out.push('"');
            out.push_str(&f.replace('"', "\"\""));
            out.push('"');
        } else {
            out.push_str(f);
        }
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_quoted() {
        let mut s = String::new();
        line(&mut s, ["a", "b,c", "say \"hi\""].into_iter());
        assert_eq!(s, "a,\"b,c\",\"say \"\"hi\"\"\"\n");
    }

    #[test]
    fn engine_labels() {
        let v = serde_json::json!({"engine": "bullet-st", "durability": "clwb", "fence_ns": 100, "threads": 2});
        let l = Labels::of_engine(&v).unwrap();
        assert_eq!((l.engine.as_str(), l.variant.as_str()), ("bullet", "st"));
        assert_eq!(
            (l.durability.as_str(), l.strategy.as_str()),
            ("pmem", "clwb")
        );
        let v = serde_json::json!({"engine": "volatile", "durability": "volatile", "fence_ns": 0, "threads": 1});
        let l = Labels::of_engine(&v).unwrap();
        assert_eq!(
            (l.engine.as_str(), l.variant.as_str()),
            ("volatile", "none")
        );
        assert_eq!(
            (l.durability.as_str(), l.strategy.as_str()),
            ("volatile", "none")
        );
    }
}
