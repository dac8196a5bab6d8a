//! Child processes of a scenario: each runs in a process group of its own (so a
//! timeout kills its own children too, such as `bench recovery`'s filling
//! process), dies with the scenario (`PR_SET_PDEATHSIG`), and is killed with its
//! group when its guard drops, on every way out. Waits are bounded.

use super::BenchResult;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How often waits poll.
const POLL: Duration = Duration::from_millis(2);

/// Puts the child in a process group of its own and has the kernel kill it when
/// this process dies (also abruptly: SIGKILL, panic = abort).
fn isolate(cmd: &mut Command) {
    cmd.process_group(0);
    // SAFETY: the closure runs in the forked child before exec; prctl(2) is
    // async-signal-safe and touches no memory shared with the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A running child; dropping it kills the child's process group and reaps it.
pub struct Guard {
    child: Child,
    what: String,
    reaped: bool,
}

impl Guard {
    /// Starts `cmd` isolated (see [`isolate`]); `what` names it in errors.
    pub fn spawn(mut cmd: Command, what: &str) -> BenchResult<Guard> {
        isolate(&mut cmd);
        let child = cmd.spawn().map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                format!(
                    "{what}: {:?} not found{}",
                    cmd.get_program(),
                    install_hint(cmd.get_program())
                )
            } else {
                format!("{what}: cannot start {:?}: {e}", cmd.get_program())
            }
        })?;
        Ok(Guard {
            child,
            what: what.to_string(),
            reaped: false,
        })
    }

    /// The child's process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The exit status once the child has exited (it is then reaped).
    pub fn try_wait(&mut self) -> BenchResult<Option<ExitStatus>> {
        let st = self
            .child
            .try_wait()
            .map_err(|e| format!("{}: wait: {e}", self.what))?;
        if st.is_some() {
            self.reaped = true;
        }
        Ok(st)
    }

    /// Waits until the child exits, at most `timeout` (an error after that: the
    /// guard kills it when it drops). Stops early when `stop` is set.
    pub fn wait_timeout(
        &mut self,
        timeout: Duration,
        stop: &AtomicBool,
    ) -> BenchResult<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.try_wait()? {
                return Ok(st);
            }
            if stop.load(Ordering::Relaxed) {
                return Err("interrupted".into());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{}: still running after {:.0} s; killed",
                    self.what,
                    timeout.as_secs_f64()
                ));
            }
            std::thread::sleep(POLL);
        }
    }

    /// SIGKILL to the child's process group now, and reaps the child; returns
    /// its exit status (a signal, unless it had exited already).
    pub fn kill(&mut self) -> BenchResult<ExitStatus> {
        self.kill_group();
        let st = self
            .child
            .wait()
            .map_err(|e| format!("{}: wait: {e}", self.what))?;
        self.reaped = true;
        Ok(st)
    }

    /// SIGKILL to the child's whole process group (while the child is not
    /// reaped its pid, which is the group id, cannot be reused).
    fn kill_group(&self) {
        if !self.reaped {
            // SAFETY: kill(2) with a negative pid signals a process group; no
            // memory is passed.
            unsafe {
                libc::kill(-(self.child.id() as libc::pid_t), libc::SIGKILL);
            }
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.kill_group();
        if !self.reaped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Where to get a missing peer program.
fn install_hint(program: &std::ffi::OsStr) -> &'static str {
    match program.to_str() {
        Some("redis-server") => {
            " (install the Debian package redis-server: apt-get install redis-server)"
        }
        Some("redis-benchmark") | Some("redis-cli") => {
            " (install the Debian package redis-tools: apt-get install redis-tools)"
        }
        Some("memcached") => " (install the Debian package memcached: apt-get install memcached)",
        _ => "",
    }
}

/// Reads a pipe to the end on a thread of its own; the text arrives on the channel.
fn drain<R: Read + Send + 'static>(r: Option<R>) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut r) = r {
            let _ = r.read_to_end(&mut buf);
        }
        let _ = tx.send(String::from_utf8_lossy(&buf).into_owned());
    });
    rx
}

/// The last lines of a child's stderr, for an error message.
pub fn tail(s: &str, lines: usize) -> String {
    let v: Vec<&str> = s.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

/// Runs `cmd` to the end (at most `timeout`) and returns its standard output;
/// a failure or a timeout is an error that quotes the end of its stderr.
pub fn run_capture(
    mut cmd: Command,
    what: &str,
    timeout: Duration,
    stop: &AtomicBool,
) -> BenchResult<String> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut g = Guard::spawn(cmd, what)?;
    let out = drain(g.child.stdout.take());
    let err = drain(g.child.stderr.take());
    let waited = g.wait_timeout(timeout, stop);
    if waited.is_err() {
        // Kill now (not when `g` drops) so that the pipes close.
        g.kill_group();
    }
    // A grandchild that outlived its parent would hold the pipes open.
    let grace = Duration::from_secs(5);
    let collect = |rx: &mpsc::Receiver<String>| rx.recv_timeout(grace).unwrap_or_default();
    let stdout = collect(&out);
    let stderr = collect(&err);
    let status = waited.map_err(|e| format!("{e}\n{}", tail(&stderr, 10)))?;
    if !status.success() {
        return Err(format!("{what}: {status}\n{}", tail(&stderr, 10)));
    }
    Ok(stdout)
}

/// A directory removed (with its contents) when the value drops.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new directory `<tmp>/ember-scenario-<pid>-<name>`.
    pub fn for_scenario(name: &str) -> BenchResult<TempDir> {
        let parent = std::env::temp_dir();
        TempDir::new_in(
            &parent,
            &format!("ember-scenario-{}-{name}", std::process::id()),
        )
    }

    /// A new directory `parent/name` (emptied first if a previous run left it).
    pub fn new_in(parent: &Path, name: &str) -> BenchResult<TempDir> {
        let p = parent.join(name);
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).map_err(|e| format!("cannot create {}: {e}", p.display()))?;
        Ok(TempDir(p))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captures_output_and_failures() {
        let stop = AtomicBool::new(false);
        let mut c = Command::new("sh");
        c.args(["-c", "echo hello; echo oops >&2"]);
        let out = run_capture(c, "sh", Duration::from_secs(10), &stop).unwrap();
        assert_eq!(out, "hello\n");
        let mut c = Command::new("sh");
        c.args(["-c", "echo why >&2; exit 3"]);
        let e = run_capture(c, "sh", Duration::from_secs(10), &stop).unwrap_err();
        assert!(e.contains("why"), "{e}");
    }

    #[test]
    fn timeouts_kill_the_group() {
        let stop = AtomicBool::new(false);
        let mut c = Command::new("sh");
        // The grandchild `sleep` keeps the pipes open unless the group dies.
        c.args(["-c", "sleep 30 & sleep 30"]);
        let t = Instant::now();
        let e = run_capture(c, "sh", Duration::from_millis(200), &stop).unwrap_err();
        assert!(e.contains("killed"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    }

    #[test]
    fn a_missing_program_is_named() {
        let e = Guard::spawn(Command::new("redis-server-that-is-not-here"), "peer")
            .err()
            .unwrap();
        assert!(e.contains("not found"), "{e}");
    }
}
