//! Geo commands, as Redis 7.0 has them: a geo index is a sorted set whose
//! scores are 52-bit interleaved geohashes (`crate::geohash`), so every
//! sorted-set command works on it and GEOADD is ZADD with computed scores. A
//! search scans the score ranges of the centre's geohash cell and its eight
//! neighbours, at a step chosen from the radius (Redis's cells and order, so
//! an unsorted result lists the same members in the same order), keeps the
//! points inside the shape, then sorts by distance when asked.

use super::strings::float_arg;
use super::zsets;
use super::{eq, int_arg, locked, CmdError, Ctx, R};
use crate::geohash::{self, Shape, ShapeKind};
use crate::keyspace::skey;
use crate::pqsort::pqsort;
use crate::server::Client;
use engine::types::head::ZsetHead;
use engine::types::node::Entry;
use proto::Version;
use std::cmp::Ordering;

/// A longitude and latitude argument pair, within Redis's limits.
fn lonlat(a: &[Vec<u8>]) -> Result<(f64, f64), CmdError> {
    let lon = float_arg(&a[0]).ok_or(CmdError::NotFloat)?;
    let lat = float_arg(&a[1]).ok_or(CmdError::NotFloat)?;
    if !(geohash::LONG_MIN..=geohash::LONG_MAX).contains(&lon)
        || !(geohash::LAT_MIN..=geohash::LAT_MAX).contains(&lat)
    {
        return Err(CmdError::GeoLonLat(lon, lat));
    }
    Ok((lon, lat))
}

/// Meters per unit.
fn unit(a: &[u8]) -> Result<f64, CmdError> {
    Ok(if eq(a, "m") {
        1.0
    } else if eq(a, "km") {
        1000.0
    } else if eq(a, "ft") {
        0.3048
    } else if eq(a, "mi") {
        1609.34
    } else {
        return Err(CmdError::Msg(
            "unsupported unit provided. please use M, KM, FT, MI",
        ));
    })
}

/// `radius unit`: the radius and meters per unit.
fn radius(a: &[Vec<u8>]) -> Result<(f64, f64), CmdError> {
    let r = float_arg(&a[0]).ok_or(CmdError::Msg("need numeric radius"))?;
    if r < 0.0 {
        return Err(CmdError::Msg("radius cannot be negative"));
    }
    Ok((r, unit(&a[1])?))
}

/// `width height unit`.
fn box_size(a: &[Vec<u8>]) -> Result<(f64, f64, f64), CmdError> {
    let w = float_arg(&a[0]).ok_or(CmdError::Msg("need numeric width"))?;
    let h = float_arg(&a[1]).ok_or(CmdError::Msg("need numeric height"))?;
    if h < 0.0 || w < 0.0 {
        return Err(CmdError::Msg("height or width cannot be negative"));
    }
    Ok((w, h, unit(&a[2])?))
}

/// A coordinate as Redis 7.0's `addReplyHumanLongDouble` sends it: a bulk
/// string in RESP2, a double in RESP3, both `%.17Lf` without trailing
/// zeros.
fn coord(c: &mut Client, d: f64) {
    let s = geohash::format_coord(d);
    if c.resp == Version::Resp3 {
        c.out.push(b',');
        c.out.extend_from_slice(s.as_bytes());
        c.out.extend_from_slice(b"\r\n");
    } else {
        c.bulk(s.as_bytes());
    }
}

/// GEOADD key [NX|XX] [CH] longitude latitude member [...]: ZADD with each
/// point's geohash as its score, as Redis runs it.
pub fn geoadd(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let (mut nx, mut xx) = (false, false);
    let mut at = 2;
    while at < a.len() {
        let o = &a[at];
        if eq(o, "nx") {
            nx = true;
        } else if eq(o, "xx") {
            xx = true;
        } else if !eq(o, "ch") {
            break;
        }
        at += 1;
    }
    if !(a.len() - at).is_multiple_of(3) || (xx && nx) {
        return Err(CmdError::Syntax);
    }
    let mut zadd: Vec<Vec<u8>> = Vec::with_capacity(at + (a.len() - at) / 3 * 2);
    zadd.push(b"zadd".to_vec());
    zadd.extend(a[1..at].iter().cloned());
    for p in a[at..].chunks(3) {
        let (lon, lat) = lonlat(p)?;
        let score = geohash::score_of(lon, lat).ok_or(CmdError::GeoLonLat(lon, lat))?;
        zadd.push(score.to_string().into_bytes());
        zadd.push(p[2].clone());
    }
    zsets::zadd(ctx, c, &zadd)
}

/// The scores of `members` (None for a missing member or key).
fn scores(
    ctx: &mut Ctx,
    c: &Client,
    key: &[u8],
    members: &[Vec<u8>],
) -> Result<Vec<Option<f64>>, CmdError> {
    zsets::read(ctx, c, key, |ctx, h| {
        members
            .iter()
            .map(|m| match h {
                Some(h) => zsets::score_of(ctx, h, m),
                None => Ok(None),
            })
            .collect()
    })
}

/// GEOPOS key [member ...]
pub fn geopos(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let found = scores(ctx, c, &a[1], &a[2..])?;
    c.array_header(found.len());
    for s in found {
        match s {
            Some(s) => {
                let (lon, lat) = geohash::decode_score(s);
                c.array_header(2);
                coord(c, lon);
                coord(c, lat);
            }
            None => c.reply(&proto::Reply::NullArray),
        }
    }
    Ok(())
}

/// GEOHASH key [member ...]
pub fn geohash(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let found = scores(ctx, c, &a[1], &a[2..])?;
    c.array_header(found.len());
    for s in found {
        match s {
            Some(s) => c.bulk(&geohash::geohash_string(s)),
            None => c.null(),
        }
    }
    Ok(())
}

/// GEODIST key member1 member2 [M|KM|FT|MI]
pub fn geodist(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    let to_meter = match a.len() {
        5 => unit(&a[4])?,
        n if n > 5 => return Err(CmdError::Syntax),
        _ => 1.0,
    };
    let found = scores(ctx, c, &a[1], &a[2..4])?;
    match (found[0], found[1]) {
        (Some(s1), Some(s2)) => {
            let (lon1, lat1) = geohash::decode_score(s1);
            let (lon2, lat2) = geohash::decode_score(s2);
            let d = geohash::distance(lon1, lat1, lon2, lat2) / to_meter;
            c.bulk(geohash::format_distance(d).as_bytes());
        }
        _ => c.null(),
    }
    Ok(())
}

/// Which search command runs (Redis's `georadiusGeneric` flags).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    /// GEORADIUS[_RO] key longitude latitude radius unit ...
    Radius { store: bool },
    /// GEORADIUSBYMEMBER[_RO] key member radius unit ...
    ByMember { store: bool },
    /// GEOSEARCH key ...
    Search,
    /// GEOSEARCHSTORE destination source ...
    SearchStore,
}

impl Form {
    fn src(self) -> usize {
        if self == Form::SearchStore {
            2
        } else {
            1
        }
    }
    fn base_args(self) -> usize {
        match self {
            Form::Radius { .. } => 6,
            Form::ByMember { .. } => 5,
            Form::Search => 2,
            Form::SearchStore => 3,
        }
    }
    fn search(self) -> bool {
        matches!(self, Form::Search | Form::SearchStore)
    }
    fn may_store(self) -> bool {
        matches!(
            self,
            Form::Radius { store: true } | Form::ByMember { store: true }
        )
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Sort {
    None,
    Asc,
    Desc,
}

/// A point found by a search.
struct Point {
    member: Vec<u8>,
    score: f64,
    lon: f64,
    lat: f64,
    /// Meters from the centre (in the request's unit once reported).
    dist: f64,
}

/// What a search answers.
enum Outcome {
    /// Points to reply (at most `returned`), with the options asked.
    Found {
        points: Vec<Point>,
        withdist: bool,
        withhash: bool,
        withcoord: bool,
    },
    /// The size of the stored result.
    Stored(u64),
}

/// The points of cell score range `[min, max)` inside the shape, appended
/// to `out` in the set's order; stops once `out` holds `limit` points (0:
/// no limit), as Redis's `geoGetPointsInRange`.
fn points_in_range(
    ctx: &mut Ctx,
    head: &ZsetHead,
    (min, max): (f64, f64),
    shape: &Shape,
    out: &mut Vec<Point>,
    limit: usize,
) -> Result<(), CmdError> {
    let lo = zsets::count_before(ctx, head, |e| e.score < min)?;
    let hi = zsets::count_before(ctx, head, |e| e.score < max)?;
    if hi <= lo {
        return Ok(());
    }
    for e in zsets::range(ctx, head, lo, hi - 1, false)? {
        let (lon, lat) = geohash::decode_score(e.score);
        if let Some(dist) = geohash::within(shape, lon, lat) {
            out.push(Point {
                member: e.bytes,
                score: e.score,
                lon,
                lat,
                dist,
            });
        }
        if limit > 0 && out.len() >= limit {
            break;
        }
    }
    Ok(())
}

/// The points inside `shape`, scanning the cells Redis scans in its order
/// (`membersOfAllNeighbors`): a cell equal to the last one scanned is
/// skipped (large radii make neighbours coincide), and with a limit (ANY)
/// the scan stops once it has enough.
fn search(
    ctx: &mut Ctx,
    head: &ZsetHead,
    shape: &Shape,
    limit: usize,
) -> Result<Vec<Point>, CmdError> {
    let cells = geohash::search_cells(shape);
    let mut out = Vec::new();
    // Redis tests `last_processed` as a truth value: after the centre
    // (index 0) no neighbour is compared with it.
    let mut last = 0;
    for (i, cell) in cells.iter().enumerate() {
        let Some(h) = *cell else {
            continue;
        };
        if last != 0 && cells[last] == Some(h) {
            continue;
        }
        if limit > 0 && out.len() >= limit {
            break;
        }
        points_in_range(ctx, head, geohash::cell_scores(h), shape, &mut out, limit)?;
        last = i;
    }
    Ok(out)
}

/// The position of member `m`, the centre of a search by member.
fn member_pos(ctx: &mut Ctx, head: &ZsetHead, m: &[u8]) -> Result<(f64, f64), CmdError> {
    match zsets::score_of(ctx, head, m)? {
        Some(s) => Ok(geohash::decode_score(s)),
        None => Err(CmdError::Msg("could not decode requested zset member")),
    }
}

/// The keys a search may write: GEOSEARCHSTORE's destination, or every
/// argument after a STORE or STOREDIST of GEORADIUS[BYMEMBER] (locked
/// before the arguments are parsed; locking one too many is harmless).
fn store_keys(form: Form, a: &[Vec<u8>]) -> Vec<usize> {
    match form {
        Form::SearchStore => vec![1],
        f if f.may_store() => (f.base_args()..a.len().saturating_sub(1))
            .filter(|&i| eq(&a[i], "store") || eq(&a[i], "storedist"))
            .map(|i| i + 1)
            .collect(),
        _ => Vec::new(),
    }
}

/// GEORADIUS, GEORADIUSBYMEMBER (and _RO), GEOSEARCH and GEOSEARCHSTORE:
/// Redis's `georadiusGeneric`, its checks in its order.
fn search_cmd(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>], form: Form) -> R {
    let db = c.db;
    let src = skey(db, &a[form.src()]);
    let mut sks = vec![src.clone()];
    sks.extend(store_keys(form, a).into_iter().map(|i| skey(db, &a[i])));
    let refs: Vec<&[u8]> = sks.iter().map(|k| k.as_slice()).collect();
    let outcome = locked(ctx, &refs, |ctx| {
        let z = zsets::load(ctx, &src)?;
        let head = z.as_ref().map(|z| &z.head);
        let mut shape = Shape {
            lon: 0.0,
            lat: 0.0,
            conversion: 1.0,
            kind: ShapeKind::Radius(0.0),
        };
        match form {
            Form::Radius { .. } => {
                (shape.lon, shape.lat) = lonlat(&a[2..4])?;
                let (r, conv) = radius(&a[4..6])?;
                (shape.kind, shape.conversion) = (ShapeKind::Radius(r), conv);
            }
            Form::ByMember { .. } => {
                // Without the key Redis parses the options only, to know
                // which empty reply to give.
                if let Some(h) = head {
                    (shape.lon, shape.lat) = member_pos(ctx, h, &a[2])?;
                    let (r, conv) = radius(&a[3..5])?;
                    (shape.kind, shape.conversion) = (ShapeKind::Radius(r), conv);
                }
            }
            Form::Search | Form::SearchStore => {}
        }
        let (mut withdist, mut withhash, mut withcoord) = (false, false, false);
        let (mut frommember, mut fromloc, mut byradius, mut bybox) = (false, false, false, false);
        let mut sort = Sort::None;
        let mut any = false;
        let mut count: i64 = 0;
        let mut storekey: Option<Vec<u8>> = (form == Form::SearchStore).then(|| a[1].clone());
        let mut storedist = false;
        let base = form.base_args();
        let opts = &a[base.min(a.len())..];
        let rem = opts.len();
        let mut i = 0;
        while i < rem {
            let o = &opts[i];
            if eq(o, "withdist") {
                withdist = true;
            } else if eq(o, "withhash") {
                withhash = true;
            } else if eq(o, "withcoord") {
                withcoord = true;
            } else if eq(o, "any") {
                any = true;
            } else if eq(o, "asc") {
                sort = Sort::Asc;
            } else if eq(o, "desc") {
                sort = Sort::Desc;
            } else if eq(o, "count") && i + 1 < rem {
                count = int_arg(&opts[i + 1])?;
                if count <= 0 {
                    return Err(CmdError::Msg("COUNT must be > 0"));
                }
                i += 1;
            } else if (eq(o, "store") || eq(o, "storedist")) && i + 1 < rem && form.may_store() {
                storekey = Some(opts[i + 1].clone());
                storedist = eq(o, "storedist");
                i += 1;
            } else if eq(o, "storedist") && form == Form::SearchStore {
                storedist = true;
            } else if eq(o, "frommember") && i + 1 < rem && form.search() && !fromloc {
                if let Some(h) = head {
                    (shape.lon, shape.lat) = member_pos(ctx, h, &opts[i + 1])?;
                }
                frommember = true;
                i += 1;
            } else if eq(o, "fromlonlat") && i + 2 < rem && form.search() && !frommember {
                (shape.lon, shape.lat) = lonlat(&opts[i + 1..i + 3])?;
                fromloc = true;
                i += 2;
            } else if eq(o, "byradius") && i + 2 < rem && form.search() && !bybox {
                let (r, conv) = radius(&opts[i + 1..i + 3])?;
                (shape.kind, shape.conversion) = (ShapeKind::Radius(r), conv);
                byradius = true;
                i += 2;
            } else if eq(o, "bybox") && i + 3 < rem && form.search() && !byradius {
                let (width, height, conv) = box_size(&opts[i + 1..i + 4])?;
                (shape.kind, shape.conversion) = (ShapeKind::Box { width, height }, conv);
                bybox = true;
                i += 3;
            } else {
                return Err(CmdError::Syntax);
            }
            i += 1;
        }
        if storekey.is_some() && (withdist || withhash || withcoord) {
            return Err(CmdError::Msg(if form == Form::SearchStore {
                "GEOSEARCHSTORE is not compatible with WITHDIST, WITHHASH and WITHCOORD options"
            } else {
                "STORE option in GEORADIUS is not compatible with WITHDIST, WITHHASH and WITHCOORD options"
            }));
        }
        if form.search() && !(frommember || fromloc) {
            return Err(CmdError::GeoSearchFrom(a[0].clone()));
        }
        if form.search() && !(byradius || bybox) {
            return Err(CmdError::GeoSearchBy(a[0].clone()));
        }
        if any && count == 0 {
            return Err(CmdError::Msg("the ANY argument requires COUNT argument"));
        }
        let Some(head) = head else {
            return Ok(match storekey {
                Some(k) => {
                    if ctx.ks.delete(&skey(db, &k), ctx.now)? {
                        crate::notify::event(ctx, crate::notify::GENERIC, "del", db, &k);
                    }
                    Outcome::Stored(0)
                }
                None => Outcome::Found {
                    points: Vec::new(),
                    withdist,
                    withhash,
                    withcoord,
                },
            });
        };
        // COUNT keeps the nearest points unless ANY says any will do.
        if count != 0 && sort == Sort::None && !any {
            sort = Sort::Asc;
        }
        let limit = if any {
            usize::try_from(count).unwrap_or(usize::MAX)
        } else {
            0
        };
        let mut points = search(ctx, head, &shape, limit)?;
        // Redis sorts with the C library's qsort, a stable merge sort (equal
        // distances keep the scan order), or, when COUNT keeps fewer points
        // than were found, with its partial quicksort, whose order of equal
        // distances `pqsort` reproduces.
        let keep = match usize::try_from(count) {
            Ok(c) if c > 0 => c.min(points.len()),
            _ => points.len(),
        };
        if sort != Sort::None && !points.is_empty() {
            let desc = sort == Sort::Desc;
            if keep == points.len() {
                points.sort_by(|x, y| {
                    let o = x.dist.total_cmp(&y.dist);
                    if desc {
                        o.reverse()
                    } else {
                        o
                    }
                });
            } else {
                pqsort(&mut points, 0, keep - 1, |x, y| {
                    // `sort_gp_asc`, negated for DESC.
                    let o = if x.dist > y.dist {
                        Ordering::Greater
                    } else if x.dist == y.dist {
                        Ordering::Equal
                    } else {
                        Ordering::Less
                    };
                    if desc {
                        o.reverse()
                    } else {
                        o
                    }
                });
            }
        }
        points.truncate(keep);
        for p in &mut points {
            p.dist /= shape.conversion;
        }
        let Some(k) = storekey else {
            return Ok(Outcome::Found {
                points,
                withdist,
                withhash,
                withcoord,
            });
        };
        let mut entries: Vec<Entry> = points
            .into_iter()
            .map(|p| Entry::new(if storedist { p.dist } else { p.score }, p.member))
            .collect();
        entries.sort_by(|x, y| x.cmp_key(y.score, &y.bytes));
        entries.dedup_by(|x, y| x.bytes == y.bytes);
        let r = zsets::store(ctx, &skey(db, &k), entries)?;
        let name = if form.search() {
            "geosearchstore"
        } else {
            "georadiusstore"
        };
        zsets::store_events(ctx, db, &k, name, r);
        Ok(Outcome::Stored(r.0))
    })?;
    match outcome {
        Outcome::Stored(n) => c.int(n as i64),
        Outcome::Found {
            points,
            withdist,
            withhash,
            withcoord,
        } => {
            let extra = usize::from(withdist) + usize::from(withhash) + usize::from(withcoord);
            c.array_header(points.len());
            for p in points {
                if extra > 0 {
                    c.array_header(extra + 1);
                }
                c.bulk(&p.member);
                if withdist {
                    c.bulk(geohash::format_distance(p.dist).as_bytes());
                }
                if withhash {
                    c.int(p.score as i64);
                }
                if withcoord {
                    c.array_header(2);
                    coord(c, p.lon);
                    coord(c, p.lat);
                }
            }
        }
    }
    Ok(())
}

pub fn georadius(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    search_cmd(ctx, c, a, Form::Radius { store: true })
}

pub fn georadius_ro(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    search_cmd(ctx, c, a, Form::Radius { store: false })
}

pub fn georadiusbymember(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    search_cmd(ctx, c, a, Form::ByMember { store: true })
}

pub fn georadiusbymember_ro(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    search_cmd(ctx, c, a, Form::ByMember { store: false })
}

pub fn geosearch(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    search_cmd(ctx, c, a, Form::Search)
}

pub fn geosearchstore(ctx: &mut Ctx, c: &mut Client, a: &[Vec<u8>]) -> R {
    search_cmd(ctx, c, a, Form::SearchStore)
}
