//! The seam between scripts and the atomic unit of several commands
//! (`crate::cmd::unit`): until it is on this branch, a stand-in with the
//! same signatures that runs each command as `execute` does, each applying
//! its own writes (so a script is not yet atomic here).

use crate::clock::Stamp;
use crate::cmd::{Ctx, R};
use crate::server::Client;

/// The locks a unit runs under: store keys (db byte ‖ key), or all of them.
#[derive(Clone, Debug)]
pub enum Locks {
    Keys(Vec<Vec<u8>>),
    All,
}

/// Runs `body` as one unit.
pub fn run(
    ctx: &mut Ctx,
    c: &mut Client,
    locks: Locks,
    mut body: impl FnMut(&mut Ctx, &mut Client) -> R,
) -> R {
    let _ = locks;
    body(ctx, c)
}

/// Runs one command inside the running unit; its reply is appended to
/// `c.out` in `c.resp`.
pub fn call(ctx: &mut Ctx, c: &mut Client, args: &[Vec<u8>]) {
    let mut clock = Stamp::now();
    crate::cmd::execute(ctx, c, args, &mut clock);
}

/// Whether a command of the running unit touched a key outside its locks.
pub fn escaped(_ctx: &Ctx) -> bool {
    false
}
