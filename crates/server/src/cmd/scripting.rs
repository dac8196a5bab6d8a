//! EVAL, EVALSHA, EVAL_RO, EVALSHA_RO, SCRIPT, FUNCTION, FCALL, FCALL_RO
//! (Redis 7.0). The engine is in [`crate::lua`].

use super::{eq, help, int_arg, CmdError, Ctx, R, SUBCOMMANDS};
use crate::lua::{self, Target};
use crate::server::{Client, Shared};
use proto::Reply;

const NOSCRIPT: &str = "NOSCRIPT No matching script. Please use EVAL.";

fn script_err(text: &str) -> CmdError {
    CmdError::Script(text.into())
}

/// The number of keys at `a[2]` (checked against the arguments after it).
fn numkeys(a: &[Vec<u8>], fcall: bool) -> Result<usize, CmdError> {
    let n = match int_arg(&a[2]) {
        Ok(n) => n,
        Err(_) if fcall => return Err(script_err("ERR Bad number of keys provided")),
        Err(e) => return Err(e),
    };
    if n > (a.len() - 3) as i64 {
        return Err(script_err(
            "ERR Number of keys can't be greater than number of args",
        ));
    }
    if n < 0 {
        return Err(script_err("ERR Number of keys can't be negative"));
    }
    Ok(n as usize)
}

fn eval_generic(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], sha: bool, ro: bool) -> R {
    if sha && a[1].len() != 40 {
        return Err(script_err(NOSCRIPT));
    }
    let n = numkeys(a, false)?;
    let sc = &ctx.sh.scripting;
    let (sha, script) = if sha {
        let sha = String::from_utf8_lossy(&a[1]).to_ascii_lowercase();
        let script = sc.script(&sha).ok_or_else(|| script_err(NOSCRIPT))?;
        (sha, script)
    } else {
        lua::load_script(sc, &a[1])?
    };
    lua::run(
        ctx,
        c,
        Target::Eval { sha, script },
        &a[3..3 + n],
        &a[3 + n..],
        a,
        ro,
    )
}

pub fn eval(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    eval_generic(ctx, c, a, false, false)
}

pub fn evalsha(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    eval_generic(ctx, c, a, true, false)
}

pub fn eval_ro(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    eval_generic(ctx, c, a, false, true)
}

pub fn evalsha_ro(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    eval_generic(ctx, c, a, true, true)
}

fn fcall_generic(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], ro: bool) -> R {
    let libs = ctx.sh.scripting.libraries();
    let name = String::from_utf8_lossy(&a[1]);
    let Some((lib, index)) = libs.funcs.get(name.as_ref()).cloned() else {
        return Err(script_err("ERR Function not found"));
    };
    let n = numkeys(a, true)?;
    lua::run(
        ctx,
        c,
        Target::Function { lib, index },
        &a[3..3 + n],
        &a[3 + n..],
        a,
        ro,
    )
}

pub fn fcall(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    fcall_generic(ctx, c, a, false)
}

pub fn fcall_ro(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    fcall_generic(ctx, c, a, true)
}

/// The subcommand of container `parent` named by `a[1]`, its arity checked
/// (Redis checks it before the subcommand runs).
fn subcommand(parent: &'static str, cmd: &'static str, a: &[Vec<u8>]) -> Result<String, CmdError> {
    let sub = String::from_utf8_lossy(&a[1]).to_ascii_lowercase();
    let Some(spec) = SUBCOMMANDS
        .iter()
        .find(|s| s.parent == parent && s.name == sub)
    else {
        return Err(super::unknown_subcommand(cmd, &a[1]));
    };
    if !spec.arity_ok(a.len()) {
        return Err(super::arity_error(format!("{parent}|{sub}")));
    }
    Ok(sub)
}

const SCRIPT_HELP: &[&str] = &[
    "SCRIPT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "DEBUG (YES|SYNC|NO)",
    "    Set the debug mode for subsequent scripts executed.",
    "EXISTS <sha1> [<sha1> ...]",
    "    Return information about the existence of the scripts in the script cache.",
    "FLUSH [ASYNC|SYNC]",
    "    Flush the Lua scripts cache. Very dangerous on replicas.",
    "    When called without the optional mode argument, the behavior is determined by the",
    "    lazyfree-lazy-user-flush configuration directive. Valid modes are:",
    "    * ASYNC: Asynchronously flush the scripts cache.",
    "    * SYNC: Synchronously flush the scripts cache.",
    "KILL",
    "    Kill the currently executing Lua script.",
    "LOAD <script>",
    "    Load a script into the scripts cache without executing it.",
    "HELP",
    "    Prints this help.",
];

pub fn script(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let sc = &ctx.sh.scripting;
    match subcommand("script", "SCRIPT", a)?.as_str() {
        "help" => help(c, SCRIPT_HELP),
        "flush" => {
            if a.len() == 3 && !eq(&a[2], "sync") && !eq(&a[2], "async") {
                return Err(script_err(
                    "ERR SCRIPT FLUSH only support SYNC|ASYNC option",
                ));
            }
            if a.len() > 3 {
                return Err(script_err(
                    "ERR SCRIPT FLUSH only support SYNC|ASYNC option",
                ));
            }
            sc.flush_scripts();
            c.ok();
        }
        "exists" => {
            c.array_header(a.len() - 2);
            for sha in &a[2..] {
                c.int(sc.has_script(sha) as i64);
            }
        }
        "load" => {
            let (sha, _) = lua::load_script(sc, &a[2])?;
            c.bulk(sha.as_bytes());
        }
        "kill" => script_kill(ctx.sh, c)?,
        "debug" => {
            return Err(script_err(
                "ERR SCRIPT DEBUG is not supported: Ember has no Lua debugger",
            ))
        }
        _ => return Err(super::unknown_subcommand("SCRIPT", &a[1])),
    }
    Ok(())
}

const FUNCTION_HELP: &[&str] = &[
    "FUNCTION <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "LOAD [REPLACE] <FUNCTION CODE>",
    "    Create a new library with the given library name and code.",
    "DELETE <LIBRARY NAME>",
    "    Delete the given library.",
    "LIST [LIBRARYNAME PATTERN] [WITHCODE]",
    "    Return general information on all the libraries:",
    "    * Library name",
    "    * The engine used to run the Library",
    "    * Library description",
    "    * Functions list",
    "    * Library code (if WITHCODE is given)",
    "    It also possible to get only function that matches a pattern using LIBRARYNAME argument.",
    "STATS",
    "    Return information about the current function running:",
    "    * Function name",
    "    * Command used to run the function",
    "    * Duration in MS that the function is running",
    "    If no function is running, return nil",
    "    In addition, returns a list of available engines.",
    "KILL",
    "    Kill the current running function.",
    "FLUSH [ASYNC|SYNC]",
    "    Delete all the libraries.",
    "    When called without the optional mode argument, the behavior is determined by the",
    "    lazyfree-lazy-user-flush configuration directive. Valid modes are:",
    "    * ASYNC: Asynchronously flush the libraries.",
    "    * SYNC: Synchronously flush the libraries.",
    "DUMP",
    "    Return a serialized payload representing the current libraries, can be restored using FUNCTION RESTORE command",
    "RESTORE <PAYLOAD> [FLUSH|APPEND|REPLACE]",
    "    Restore the libraries represented by the given payload, it is possible to give a restore policy to",
    "    control how to handle existing libraries (default APPEND):",
    "    * FLUSH: delete all existing libraries.",
    "    * APPEND: appends the restored libraries to the existing libraries. On collision, abort.",
    "    * REPLACE: appends the restored libraries to the existing libraries, On collision, replace the old",
    "      libraries with the new libraries (notice that even on this option there is a chance of failure",
    "      in case of functions name collision with another library).",
    "HELP",
    "    Prints this help.",
];

pub fn function(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    match subcommand("function", "FUNCTION", a)?.as_str() {
        "help" => help(c, FUNCTION_HELP),
        "load" => function_load(ctx, c, a)?,
        "delete" => {
            let sc = &ctx.sh.scripting;
            let _w = lua::lib_write(sc);
            let mut libs = (*sc.libraries()).clone();
            if libs.remove(&String::from_utf8_lossy(&a[2])).is_none() {
                return Err(script_err("ERR Library not found"));
            }
            lua::save_libraries(ctx, libs)?;
            c.ok();
        }
        "flush" => {
            if a.len() > 3 {
                return Err(CmdError::SubcommandArgs {
                    cmd: "FUNCTION",
                    sub: a[1].clone(),
                });
            }
            if a.len() == 3 && !eq(&a[2], "sync") && !eq(&a[2], "async") {
                return Err(script_err(
                    "ERR FUNCTION FLUSH only supports SYNC|ASYNC option",
                ));
            }
            let _w = lua::lib_write(&ctx.sh.scripting);
            lua::save_libraries(ctx, lua::Libraries::default())?;
            c.ok();
        }
        "list" => function_list(ctx, c, a)?,
        "dump" => {
            let libs = ctx.sh.scripting.libraries();
            c.bulk(&lua::dump_payload(&libs));
        }
        "restore" => function_restore(ctx, c, a)?,
        "stats" => function_stats(ctx.sh, c)?,
        "kill" => function_kill(ctx.sh, c)?,
        _ => return Err(super::unknown_subcommand("FUNCTION", &a[1])),
    }
    Ok(())
}

fn function_load(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let mut replace = false;
    let mut pos = 2;
    while pos < a.len() - 1 {
        if eq(&a[pos], "replace") {
            replace = true;
            pos += 1;
            continue;
        }
        return Err(CmdError::Script(format!(
            "ERR Unknown option given: {}",
            String::from_utf8_lossy(&a[pos])
        )));
    }
    if pos >= a.len() {
        return Err(script_err("ERR Function code is missing"));
    }
    let sc = &ctx.sh.scripting;
    let _w = lua::lib_write(sc);
    let current = sc.libraries();
    let lib = lua::check_library(sc, &a[pos])?;
    let name = lib.name.clone();
    let libs = lua::join_libraries(&current, vec![lib], replace, true)?;
    lua::save_libraries(ctx, libs)?;
    c.bulk(name.as_bytes());
    Ok(())
}

fn function_list(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let (mut with_code, mut pattern): (bool, Option<&[u8]>) = (false, None);
    let mut i = 2;
    while i < a.len() {
        if !with_code && eq(&a[i], "withcode") {
            with_code = true;
        } else if pattern.is_none() && eq(&a[i], "libraryname") {
            if i >= a.len() - 1 {
                return Err(script_err("ERR library name argument was not given"));
            }
            i += 1;
            pattern = Some(&a[i]);
        } else {
            return Err(CmdError::Script(format!(
                "ERR Unknown argument {}",
                String::from_utf8_lossy(&a[i])
            )));
        }
        i += 1;
    }
    let libs = ctx.sh.scripting.libraries();
    let s = |t: &str| Reply::Bulk(t.as_bytes().to_vec());
    let mut out = Vec::new();
    for lib in libs.libs.values() {
        if let Some(p) = pattern {
            if !crate::glob::glob_match(p, lib.name.as_bytes(), true) {
                continue;
            }
        }
        let funcs = lib
            .funcs
            .iter()
            .map(|f| {
                Reply::Map(vec![
                    (s("name"), s(&f.name)),
                    (
                        s("description"),
                        f.desc.clone().map(Reply::Bulk).unwrap_or(Reply::Null),
                    ),
                    (
                        s("flags"),
                        Reply::Set(
                            lua::FLAG_NAMES
                                .iter()
                                .filter(|(bit, _)| f.flags & bit != 0)
                                .map(|(_, n)| Reply::Simple(n.to_string()))
                                .collect(),
                        ),
                    ),
                ])
            })
            .collect();
        let mut m = vec![
            (s("library_name"), s(&lib.name)),
            (s("engine"), s("LUA")),
            (s("functions"), Reply::Array(funcs)),
        ];
        if with_code {
            m.push((s("library_code"), Reply::Bulk(lib.code.clone())));
        }
        out.push(Reply::Map(m));
    }
    c.reply(&Reply::Array(out));
    Ok(())
}

fn function_restore(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    if a.len() > 4 {
        return Err(CmdError::SubcommandArgs {
            cmd: "FUNCTION",
            sub: a[1].clone(),
        });
    }
    #[derive(PartialEq)]
    enum Policy {
        Append,
        Replace,
        Flush,
    }
    let policy =
        match a.get(3) {
            None => Policy::Append,
            Some(p) if eq(p, "append") => Policy::Append,
            Some(p) if eq(p, "replace") => Policy::Replace,
            Some(p) if eq(p, "flush") => Policy::Flush,
            Some(_) => return Err(script_err(
                "ERR Wrong restore policy given, value should be either FLUSH, APPEND or REPLACE.",
            )),
        };
    let codes = lua::restore_payload(&a[2]).map_err(CmdError::Script)?;
    let sc = &ctx.sh.scripting;
    let _w = lua::lib_write(sc);
    let mut new = Vec::new();
    for code in codes {
        new.push(lua::check_library(sc, &code)?);
    }
    let libs = if policy == Policy::Flush {
        lua::join_libraries(&lua::Libraries::default(), new, false, false)?
    } else {
        lua::join_libraries(&sc.libraries(), new, policy == Policy::Replace, false)?
    };
    lua::save_libraries(ctx, libs)?;
    c.ok();
    Ok(())
}

/// SCRIPT KILL (also run while a script is busy, see `busy`).
pub(crate) fn script_kill(sh: &Shared, c: &mut Client) -> R {
    sh.scripting.kill(true)?;
    c.ok();
    Ok(())
}

/// FUNCTION KILL (also run while a script is busy).
pub(crate) fn function_kill(sh: &Shared, c: &mut Client) -> R {
    sh.scripting.kill(false)?;
    c.ok();
    Ok(())
}

/// FUNCTION STATS (also run while a script is busy).
pub(crate) fn function_stats(sh: &Shared, c: &mut Client) -> R {
    let sc = &sh.scripting;
    if sc.running_eval() {
        return Err(script_err(lua::BUSY_EVAL));
    }
    let s = |t: &str| Reply::Bulk(t.as_bytes().to_vec());
    let running = match sc.running() {
        None => Reply::Null,
        Some((name, argv, ms)) => Reply::Map(vec![
            (s("name"), s(&name)),
            (
                s("command"),
                Reply::Array(argv.into_iter().map(Reply::Bulk).collect()),
            ),
            (s("duration_ms"), Reply::Integer(ms as i64)),
        ]),
    };
    let libs = sc.libraries();
    c.reply(&Reply::Map(vec![
        (s("running_script"), running),
        (
            s("engines"),
            Reply::Map(vec![(
                s("LUA"),
                Reply::Map(vec![
                    (s("libraries_count"), Reply::Integer(libs.libs.len() as i64)),
                    (
                        s("functions_count"),
                        Reply::Integer(libs.function_count() as i64),
                    ),
                ]),
            )]),
        ),
    ]));
    Ok(())
}
