//! The ACL command (Redis 7.0's subcommands and texts); the users, their rules
//! and checks live in [`crate::acl`].

use super::{eq, int_arg, CmdError, Ctx, R};
use crate::acl::{self as users, Denied};
use crate::server::Client;
use proto::Reply;

fn bulk(b: impl Into<Vec<u8>>) -> Reply {
    Reply::Bulk(b.into())
}

pub fn acl(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let Some(id) = users::resolve(super::lookup(b"acl").unwrap_or(0), a)
        .filter(|&id| users::cmd(id).parent.is_some())
    else {
        return Err(super::unknown_subcommand("ACL", &a[1]));
    };
    let cmd = users::cmd(id);
    if !cmd.arity_ok(a.len()) {
        return Err(super::arity_error(cmd.name.clone()));
    }
    let acl = &ctx.sh.acl;
    match &cmd.name["acl|".len()..] {
        "setuser" => {
            let name = &a[2];
            if users::has_spaces(name) {
                return Err(CmdError::AclBadUsername);
            }
            acl.set_user(name, &a[3..]).map_err(CmdError::Acl)?;
            c.ok();
        }
        "deluser" => {
            if a[2..].iter().any(|n| n == b"default") {
                return Err(CmdError::AclDeleteDefault);
            }
            let gone = acl.delete(&a[2..]);
            // Connections logged in as a deleted user are closed: this one
            // after its reply, the others by their workers (woken now).
            if gone.contains(&c.user.serial) {
                c.set_user(acl, None);
                c.authed = false;
                c.close_after = true;
            }
            if !gone.is_empty() {
                wake_workers(ctx);
            }
            c.int(gone.len() as i64);
        }
        "getuser" => {
            let Some(u) = acl.user(&a[2]) else {
                c.null();
                return Ok(());
            };
            c.reply(&Reply::Map(vec![
                (
                    bulk("flags"),
                    Reply::Set(u.flags().into_iter().map(bulk).collect()),
                ),
                (
                    bulk("passwords"),
                    Reply::Array(u.passwords().iter().map(|p| bulk(p.as_str())).collect()),
                ),
                (bulk("commands"), bulk(u.commands_text())),
                (bulk("keys"), bulk(u.keys_text())),
                (bulk("channels"), bulk(u.channels_text())),
                (
                    bulk("selectors"),
                    Reply::Array(
                        u.selectors_text()
                            .into_iter()
                            .map(|(cmds, keys, chans)| {
                                Reply::Map(vec![
                                    (bulk("commands"), bulk(cmds)),
                                    (bulk("keys"), bulk(keys)),
                                    (bulk("channels"), bulk(chans)),
                                ])
                            })
                            .collect(),
                    ),
                ),
            ]));
        }
        "list" | "users" => {
            let names = cmd.name == "acl|users";
            let list = acl
                .users()
                .iter()
                .map(|u| {
                    if names {
                        bulk(u.name.clone())
                    } else {
                        let mut l = b"user ".to_vec();
                        l.extend_from_slice(&u.name);
                        l.push(b' ');
                        l.extend_from_slice(&u.describe());
                        bulk(l)
                    }
                })
                .collect();
            c.reply(&Reply::Array(list));
        }
        "whoami" => c.bulk(&c.user.name.clone()),
        "load" => {
            if acl.file.is_none() {
                return Err(CmdError::AclNoFile);
            }
            acl.load().map_err(CmdError::Acl)?;
            // Every user but `default` is a new one: their connections are
            // closed, this one after its reply.
            if c.user.name != b"default" {
                c.set_user(acl, None);
                c.authed = false;
                c.close_after = true;
            } else {
                c.acl_epoch = acl.epoch();
                c.user = acl.default_user();
            }
            wake_workers(ctx);
            c.ok();
        }
        "save" => {
            if acl.file.is_none() {
                return Err(CmdError::AclNoFile);
            }
            if let Err(e) = acl.save() {
                eprintln!("ember: {e}");
                return Err(CmdError::AclSave);
            }
            c.ok();
        }
        "cat" => {
            let list: Vec<Reply> = if a.len() == 2 {
                super::Cats::ALL.iter().map(|(_, n)| bulk(*n)).collect()
            } else if a.len() == 3 {
                let cat = std::str::from_utf8(&a[2])
                    .ok()
                    .and_then(super::Cats::by_name)
                    .ok_or_else(|| CmdError::AclUnknownCategory(a[2].clone()))?;
                users::commands_in(cat).map(bulk).collect()
            } else {
                return Err(subcommand_syntax(&a[1]));
            };
            c.reply(&Reply::Array(list));
        }
        "genpass" => {
            let bits = match a.len() {
                2 => 256,
                3 => int_arg(&a[2])?,
                _ => return Err(subcommand_syntax(&a[1])),
            };
            if !(1..=4096).contains(&bits) {
                return Err(CmdError::AclGenpassBits);
            }
            c.bulk(users::random_hex((bits as usize).div_ceil(4)).as_bytes());
        }
        "log" => {
            let mut count = 10i64;
            match a.len() {
                2 => {}
                3 if eq(&a[2], "reset") => {
                    acl.log_reset();
                    c.ok();
                    return Ok(());
                }
                3 => count = int_arg(&a[2])?.max(0),
                _ => return Err(subcommand_syntax(&a[1])),
            }
            let entries = acl.log_entries(count.min(u32::MAX as i64) as usize);
            let list = entries
                .into_iter()
                .map(|(e, age)| {
                    Reply::Map(vec![
                        (bulk("count"), Reply::Integer(e.count as i64)),
                        (bulk("reason"), bulk(e.reason)),
                        (bulk("context"), bulk(e.context)),
                        (bulk("object"), bulk(e.object)),
                        (bulk("username"), bulk(e.username)),
                        (bulk("age-seconds"), Reply::Double(age)),
                        (bulk("client-info"), bulk(e.client_info)),
                    ])
                })
                .collect();
            c.reply(&Reply::Array(list));
        }
        "dryrun" => {
            let u = acl
                .user(&a[2])
                .ok_or_else(|| CmdError::AclNoUser(a[2].clone()))?;
            let args = &a[3..];
            let id = super::lookup(&args[0])
                .and_then(|i| users::resolve(i, args))
                .ok_or_else(|| CmdError::AclNoCommand(args[0].clone()))?;
            let target = users::cmd(id);
            if !target.arity_ok(args.len()) {
                return Err(super::arity_error(target.name.clone()));
            }
            match u.check_id(id, args) {
                Ok(()) => c.ok(),
                Err(Denied::Command(d)) => c.bulk(
                    format!(
                        "This user has no permissions to run the '{}' command",
                        users::cmd(d).name
                    )
                    .as_bytes(),
                ),
                Err(Denied::Key(k)) => {
                    let mut t = b"This user has no permissions to access the '".to_vec();
                    t.extend_from_slice(&args[k]);
                    t.extend_from_slice(b"' key");
                    c.bulk(&t);
                }
                Err(Denied::Channel(k)) => {
                    let mut t = b"This user has no permissions to access the '".to_vec();
                    t.extend_from_slice(&args[k]);
                    t.extend_from_slice(b"' channel");
                    c.bulk(&t);
                }
            }
        }
        "help" => {
            let lines = [
                "ACL <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "CAT [<category>]",
                "    List all commands that belong to <category>, or all command categories",
                "    when no category is specified.",
                "DELUSER <username> [<username> ...]",
                "    Delete a list of users.",
                "DRYRUN <username> <command> [<arg> ...]",
                "    Returns whether the user can execute the given command without executing the command.",
                "GETUSER <username>",
                "    Get the user's details.",
                "GENPASS [<bits>]",
                "    Generate a secure 256-bit user password. The optional `bits` argument can",
                "    be used to specify a different size.",
                "LIST",
                "    Show users details in config file format.",
                "LOAD",
                "    Reload users from the ACL file.",
                "LOG [<count> | RESET]",
                "    Show the ACL log entries.",
                "SAVE",
                "    Save the current config to the ACL file.",
                "SETUSER <username> <attribute> [<attribute> ...]",
                "    Create or modify a user with the specified attributes.",
                "USERS",
                "    List all the registered usernames.",
                "WHOAMI",
                "    Return the current connection username.",
                "HELP",
                "    Prints this help.",
            ];
            super::help(c, &lines);
        }
        _ => return Err(super::unknown_subcommand("ACL", &a[1])),
    }
    Ok(())
}

/// Redis's reply to a known subcommand with arguments it does not take.
fn subcommand_syntax(sub: &[u8]) -> CmdError {
    CmdError::Acl(format!(
        "unknown subcommand or wrong number of arguments for '{}'. Try ACL HELP.",
        String::from_utf8_lossy(sub)
    ))
}

/// Wakes every worker so that connections of deleted users are closed now,
/// not at their next request.
pub(super) fn wake_workers(ctx: &Ctx) {
    for w in ctx
        .sh
        .wakers
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
    {
        let _ = w.wake();
    }
}
