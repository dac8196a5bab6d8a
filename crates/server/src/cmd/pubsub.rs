//! Pub/Sub commands: (P|S)SUBSCRIBE, (P|S)UNSUBSCRIBE, PUBLISH, SPUBLISH and
//! PUBSUB's introspection. The registry and delivery are `crate::pubsub`.

use super::{eq, CmdError, Ctx, R};
use crate::pubsub::{self as ps, Kind};
use crate::server::Client;
use proto::Reply;

/// A subscription needs a poll loop to deliver to: the in-process executor
/// has none.
fn no_delivery(name: &str) -> CmdError {
    CmdError::NotSupported {
        what: name.to_ascii_uppercase(),
        why: " in the in-process executor (it has no connection to deliver messages to)",
    }
}

fn sub(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], k: Kind, name: &str) -> R {
    if ps::subscribe(ctx.sh, c, k, &a[1..]) {
        Ok(())
    } else {
        Err(no_delivery(name))
    }
}

pub fn subscribe(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    sub(ctx, c, a, Kind::Channel, "subscribe")
}

pub fn psubscribe(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    sub(ctx, c, a, Kind::Pattern, "psubscribe")
}

pub fn ssubscribe(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    sub(ctx, c, a, Kind::Shard, "ssubscribe")
}

pub fn unsubscribe(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    ps::unsubscribe(ctx.sh, c, Kind::Channel, &a[1..]);
    Ok(())
}

pub fn punsubscribe(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    ps::unsubscribe(ctx.sh, c, Kind::Pattern, &a[1..]);
    Ok(())
}

pub fn sunsubscribe(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    ps::unsubscribe(ctx.sh, c, Kind::Shard, &a[1..]);
    Ok(())
}

pub fn publish(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    publish_on(ctx, c, false, a)
}

pub fn spublish(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    publish_on(ctx, c, true, a)
}

/// PUBLISH and SPUBLISH: on a cluster's leader the message first goes
/// through the log to every node (`crate::cluster::Cluster::publish`);
/// the reply counts this node's receivers, as Redis Cluster's does.
fn publish_on(ctx: &mut Ctx, c: &mut Client, shard: bool, a: &[Vec<u8>]) -> R {
    if let Some(cl) = ctx.sh.cluster.get() {
        cl.publish(shard, &a[1], &a[2])
            .map_err(crate::cmd::CmdError::Text)?;
    }
    let n = ctx.sh.pubsub.publish(shard, &a[1], &a[2]);
    c.int(n as i64);
    Ok(())
}

fn channel_list(c: &mut Client, v: Vec<Vec<u8>>) {
    c.reply(&Reply::Array(v.into_iter().map(Reply::Bulk).collect()));
}

fn numsub(ctx: &Ctx, c: &mut Client, shard: bool, channels: &[Vec<u8>]) {
    let mut v = Vec::with_capacity(channels.len() * 2);
    for ch in channels {
        v.push(Reply::Bulk(ch.clone()));
        v.push(Reply::Integer(ctx.sh.pubsub.numsub(shard, ch) as i64));
    }
    c.reply(&Reply::Array(v));
}

pub fn pubsub(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let wrong_args = || CmdError::SubcommandArgs {
        cmd: "PUBSUB",
        sub: a[1].clone(),
    };
    let s = &a[1];
    if eq(s, "channels") || eq(s, "shardchannels") {
        if a.len() > 3 {
            return Err(wrong_args());
        }
        let shard = eq(s, "shardchannels");
        let v = ctx
            .sh
            .pubsub
            .channels(shard, a.get(2).map(|p| p.as_slice()));
        channel_list(c, v);
    } else if eq(s, "numsub") || eq(s, "shardnumsub") {
        numsub(ctx, c, eq(s, "shardnumsub"), &a[2..]);
    } else if eq(s, "numpat") {
        if a.len() != 2 {
            return Err(super::arity_error("pubsub|numpat"));
        }
        c.int(ctx.sh.pubsub.counts().1 as i64);
    } else if eq(s, "help") {
        if a.len() != 2 {
            return Err(super::arity_error("pubsub|help"));
        }
        super::help(
            c,
            &[
                "PUBSUB <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "CHANNELS [<pattern>]",
                "    Return the currently active channels matching a <pattern> (default: '*').",
                "NUMPAT",
                "    Return number of subscriptions to patterns.",
                "NUMSUB [<channel> ...]",
                "    Return the number of subscribers for the specified channels, excluding",
                "    pattern subscriptions(default: no channels).",
                "SHARDCHANNELS [<pattern>]",
                "    Return the currently active shard level channels matching a <pattern> (default: '*').",
                "SHARDNUMSUB [<shardchannel> ...]",
                "    Return the number of subscribers for the specified shard level channel(s)",
                "HELP",
                "    Prints this help.",
            ],
        );
    } else {
        return Err(super::unknown_subcommand("PUBSUB", s));
    }
    Ok(())
}
