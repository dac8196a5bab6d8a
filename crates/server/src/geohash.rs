//! Geohash arithmetic as Redis 7.0 does it (`geohash.c`,
//! `geohash_helper.c`), so that Ember's geo commands store the same scores
//! and answer the same positions, distances and search results as
//! redis-server: a point is a 52-bit interleaved geohash (26 bits of
//! latitude in the even bits, 26 of longitude in the odd ones) over
//! longitudes -180..180 and latitudes -85.05112878..85.05112878 (the
//! Web-Mercator limits), stored as a sorted-set score. Every formula keeps
//! Redis's order of floating-point operations; the trigonometric functions
//! are the C library's, as Redis's are.

/// Bits per coordinate of a stored point (26 × 2 = 52: exact in a double).
pub const STEP_MAX: u8 = 26;
pub const LAT_MIN: f64 = -85.05112878;
pub const LAT_MAX: f64 = 85.05112878;
pub const LONG_MIN: f64 = -180.0;
pub const LONG_MAX: f64 = 180.0;

/// Redis's earth radius for WGS-84 distances (meters).
const EARTH_RADIUS_IN_METERS: f64 = 6372797.560856;
/// Half the Web-Mercator world's width (meters): the search step estimate
/// doubles a radius until it reaches it.
const MERCATOR_MAX: f64 = 20037726.37;
/// Degrees to radians (`M_PI / 180.0`).
const D_R: f64 = std::f64::consts::PI / 180.0;

/// A geohash of `step` bits per coordinate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hash {
    pub bits: u64,
    pub step: u8,
}

/// A coordinate interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Range {
    pub min: f64,
    pub max: f64,
}

/// The cell a geohash names.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Area {
    pub lon: Range,
    pub lat: Range,
}

const LON_RANGE: Range = Range {
    min: LONG_MIN,
    max: LONG_MAX,
};
const LAT_RANGE: Range = Range {
    min: LAT_MIN,
    max: LAT_MAX,
};

/// Spreads the 32 bits of `lat` into the even bits and those of `lon` into
/// the odd bits.
fn interleave(lat: u32, lon: u32) -> u64 {
    fn spread(v: u32) -> u64 {
        let mut x = u64::from(v);
        x = (x | (x << 16)) & 0x0000_FFFF_0000_FFFF;
        x = (x | (x << 8)) & 0x00FF_00FF_00FF_00FF;
        x = (x | (x << 4)) & 0x0F0F_0F0F_0F0F_0F0F;
        x = (x | (x << 2)) & 0x3333_3333_3333_3333;
        (x | (x << 1)) & 0x5555_5555_5555_5555
    }
    spread(lat) | (spread(lon) << 1)
}

/// The inverse of [`interleave`]: latitude bits in the low 32 bits of the
/// result, longitude bits in the high 32.
fn deinterleave(v: u64) -> u64 {
    fn squash(mut x: u64) -> u64 {
        x &= 0x5555_5555_5555_5555;
        x = (x | (x >> 1)) & 0x3333_3333_3333_3333;
        x = (x | (x >> 2)) & 0x0F0F_0F0F_0F0F_0F0F;
        x = (x | (x >> 4)) & 0x00FF_00FF_00FF_00FF;
        x = (x | (x >> 8)) & 0x0000_FFFF_0000_FFFF;
        (x | (x >> 16)) & 0x0000_0000_FFFF_FFFF
    }
    squash(v) | (squash(v >> 1) << 32)
}

/// The geohash of a point over the given ranges (`geohashEncode`); None
/// outside the ranges or Redis's limits, or for a step outside 1..=32.
pub fn encode(lon_r: Range, lat_r: Range, lon: f64, lat: f64, step: u8) -> Option<Hash> {
    if step == 0 || step > 32 {
        return None;
    }
    let outside_limits =
        !(LONG_MIN..=LONG_MAX).contains(&lon) || !(LAT_MIN..=LAT_MAX).contains(&lat);
    if outside_limits || lat < lat_r.min || lat > lat_r.max || lon < lon_r.min || lon > lon_r.max {
        return None;
    }
    let mut lat_off = (lat - lat_r.min) / (lat_r.max - lat_r.min);
    let mut lon_off = (lon - lon_r.min) / (lon_r.max - lon_r.min);
    let scale = (1u64 << step) as f64;
    lat_off *= scale;
    lon_off *= scale;
    // C converts the offsets to uint32_t by truncation, as `as` does here.
    Some(Hash {
        bits: interleave(lat_off as u32, lon_off as u32),
        step,
    })
}

/// [`encode`] over Redis's ranges.
pub fn encode_wgs84(lon: f64, lat: f64, step: u8) -> Option<Hash> {
    encode(LON_RANGE, LAT_RANGE, lon, lat, step)
}

/// The cell of `h` over the given ranges (`geohashDecode`).
pub fn decode(lon_r: Range, lat_r: Range, h: Hash) -> Area {
    let sep = deinterleave(h.bits);
    let lat_scale = lat_r.max - lat_r.min;
    let lon_scale = lon_r.max - lon_r.min;
    let ilat = sep as u32;
    let ilon = (sep >> 32) as u32;
    let div = (1u64 << h.step) as f64;
    let lat_min = lat_r.min + (f64::from(ilat) / div) * lat_scale;
    let lat_max = lat_r.min + (f64::from(ilat.wrapping_add(1)) / div) * lat_scale;
    let lon_min = lon_r.min + (f64::from(ilon) / div) * lon_scale;
    let lon_max = lon_r.min + (f64::from(ilon.wrapping_add(1)) / div) * lon_scale;
    Area {
        lon: Range {
            min: lon_min,
            max: lon_max,
        },
        lat: Range {
            min: lat_min,
            max: lat_max,
        },
    }
}

/// C's `(uint64_t)` conversion of a double as x86-64 compilers emit it
/// (`cvttsd2si`, on `x - 2^63` for values from 2^63): a score GEOADD did
/// not write (ZADD of a negative or huge score) decodes to the position
/// Redis reports for it.
fn c_to_u64(x: f64) -> u64 {
    const TWO63: f64 = 9_223_372_036_854_775_808.0;
    // `cvttsd2si`'s answer for a value out of the signed range.
    const INDEFINITE: u64 = 1 << 63;
    if x < TWO63 {
        if x >= -TWO63 {
            x as i64 as u64
        } else {
            INDEFINITE
        }
    } else {
        let y = x - TWO63;
        let r = if y < TWO63 {
            y as i64 as u64
        } else {
            INDEFINITE
        };
        r ^ (1 << 63)
    }
}

/// The point a stored score stands for: the centre of its cell, clamped to
/// Redis's limits (`decodeGeohash`). The score is truncated to an integer
/// first, as C's conversion to `uint64_t` does.
pub fn decode_score(score: f64) -> (f64, f64) {
    let a = decode(
        LON_RANGE,
        LAT_RANGE,
        Hash {
            bits: c_to_u64(score),
            step: STEP_MAX,
        },
    );
    let lon = ((a.lon.min + a.lon.max) / 2.0).clamp(LONG_MIN, LONG_MAX);
    let lat = ((a.lat.min + a.lat.max) / 2.0).clamp(LAT_MIN, LAT_MAX);
    (lon, lat)
}

/// `h`'s bits left-aligned to 52 bits: the score of the first point of its
/// cell (`geohashAlign52Bits`).
pub fn align52(h: Hash) -> u64 {
    h.bits << (52 - u32::from(h.step) * 2)
}

/// The score GEOADD stores for a point (already checked against the
/// limits).
pub fn score_of(lon: f64, lat: f64) -> Option<u64> {
    encode_wgs84(lon, lat, STEP_MAX).map(align52)
}

/// The standard 11-character geohash of a stored score (GEOHASH): the point
/// re-encoded over latitudes -90..90, whose 52 bits give 10 characters; the
/// 11th is `0`, as Redis writes it.
pub fn geohash_string(score: f64) -> [u8; 11] {
    const ALPHABET: &[u8; 32] = b"0123456789bcdefghjkmnpqrstuvwxyz";
    let (lon, lat) = decode_score(score);
    let full = Range {
        min: -90.0,
        max: 90.0,
    };
    let bits = encode(LON_RANGE, full, lon, lat, STEP_MAX).map_or(0, |h| h.bits);
    let mut out = [b'0'; 11];
    for (i, c) in out.iter_mut().enumerate().take(10) {
        *c = ALPHABET[((bits >> (52 - (i + 1) * 5)) & 0x1f) as usize];
    }
    out
}

/// Moves `h` one cell along the coordinate whose bits `mask` selects (odd
/// bits: longitude, even bits: latitude), wrapping within the step
/// (`geohash_move_x` / `geohash_move_y`).
fn move_along(h: &mut Hash, mask: u64, d: i8) {
    if d == 0 {
        return;
    }
    let shift = 64 - u32::from(h.step) * 2;
    let mut moving = h.bits & mask;
    let other = h.bits & !mask;
    // Ones in the other coordinate's bits: adding carries across them.
    let zz = !mask >> shift;
    if d > 0 {
        moving = moving.wrapping_add(zz + 1);
    } else {
        moving |= zz;
        moving = moving.wrapping_sub(zz + 1);
    }
    moving &= mask >> shift;
    h.bits = moving | other;
}

fn moved(h: Hash, dx: i8, dy: i8) -> Hash {
    let mut n = h;
    move_along(&mut n, 0xaaaa_aaaa_aaaa_aaaa, dx);
    move_along(&mut n, 0x5555_5555_5555_5555, dy);
    n
}

/// The shape a search covers, around its centre (`GeoShape`); sizes in the
/// request's unit, `conversion` meters per unit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    pub lon: f64,
    pub lat: f64,
    pub conversion: f64,
    pub kind: ShapeKind,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ShapeKind {
    Radius(f64),
    Box { width: f64, height: f64 },
}

/// The search step for a radius (`geohashEstimateStepsByRadius`): cells
/// about as large as the radius, larger near the poles.
pub fn estimate_steps(range_meters: f64, lat: f64) -> u8 {
    if range_meters == 0.0 {
        return 26;
    }
    let mut range = range_meters;
    let mut step: i32 = 1;
    while range < MERCATOR_MAX {
        range *= 2.0;
        step += 1;
    }
    step -= 2;
    if !(-66.0..=66.0).contains(&lat) {
        step -= 1;
        if !(-80.0..=80.0).contains(&lat) {
            step -= 1;
        }
    }
    step.clamp(1, 26) as u8
}

fn deg_rad(a: f64) -> f64 {
    a * D_R
}

fn rad_deg(a: f64) -> f64 {
    a / D_R
}

/// The shape's bounding box: [min lon, min lat, max lon, max lat]
/// (`geohashBoundingBox`).
pub fn bounding_box(s: &Shape) -> [f64; 4] {
    let (h, w) = match s.kind {
        ShapeKind::Radius(r) => (r, r),
        ShapeKind::Box { width, height } => (height / 2.0, width / 2.0),
    };
    let height = s.conversion * h;
    let width = s.conversion * w;
    let lat_delta = rad_deg(height / EARTH_RADIUS_IN_METERS);
    let long_delta_top = rad_deg(width / EARTH_RADIUS_IN_METERS / deg_rad(s.lat + lat_delta).cos());
    let long_delta_bottom =
        rad_deg(width / EARTH_RADIUS_IN_METERS / deg_rad(s.lat - lat_delta).cos());
    let delta = if s.lat < 0.0 {
        long_delta_bottom
    } else {
        long_delta_top
    };
    [
        s.lon - delta,
        s.lat - lat_delta,
        s.lon + delta,
        s.lat + lat_delta,
    ]
}

/// The cells a search scans, in Redis's order: the centre's cell, then
/// north, south, east, west, north-east, north-west, south-east,
/// south-west; None for a neighbour Redis excludes as outside the shape's
/// bounding box (`geohashCalculateAreasByShapeWGS84`).
pub fn search_cells(s: &Shape) -> [Option<Hash>; 9] {
    let b = bounding_box(s);
    let (min_lon, min_lat, max_lon, max_lat) = (b[0], b[1], b[2], b[3]);
    let radius_meters = match s.kind {
        ShapeKind::Radius(r) => r,
        ShapeKind::Box { width, height } => {
            ((width / 2.0) * (width / 2.0) + (height / 2.0) * (height / 2.0)).sqrt()
        }
    } * s.conversion;
    let mut steps = estimate_steps(radius_meters, s.lat);
    // The centre is within Redis's limits (checked when parsed, or decoded
    // from a score), so it encodes at every step.
    let cell = |steps: u8| {
        encode_wgs84(s.lon, s.lat, steps).unwrap_or(Hash {
            bits: 0,
            step: steps,
        })
    };
    let mut hash = cell(steps);
    let area_of = |h: Hash| decode(LON_RANGE, LAT_RANGE, h);
    let too_small = |h: Hash| {
        area_of(moved(h, 0, 1)).lat.max < max_lat
            || area_of(moved(h, 0, -1)).lat.min > min_lat
            || area_of(moved(h, 1, 0)).lon.max < max_lon
            || area_of(moved(h, -1, 0)).lon.min > min_lon
    };
    if steps > 1 && too_small(hash) {
        steps -= 1;
        hash = cell(steps);
    }
    let area = area_of(hash);
    let mut n = [
        Some(hash),
        Some(moved(hash, 0, 1)),   // north
        Some(moved(hash, 0, -1)),  // south
        Some(moved(hash, 1, 0)),   // east
        Some(moved(hash, -1, 0)),  // west
        Some(moved(hash, 1, 1)),   // north-east
        Some(moved(hash, -1, 1)),  // north-west
        Some(moved(hash, 1, -1)),  // south-east
        Some(moved(hash, -1, -1)), // south-west
    ];
    if steps >= 2 {
        if area.lat.min < min_lat {
            for i in [2, 8, 7] {
                n[i] = None;
            }
        }
        if area.lat.max > max_lat {
            for i in [1, 5, 6] {
                n[i] = None;
            }
        }
        if area.lon.min < min_lon {
            for i in [4, 8, 6] {
                n[i] = None;
            }
        }
        if area.lon.max > max_lon {
            for i in [3, 7, 5] {
                n[i] = None;
            }
        }
    }
    n
}

/// The score interval `[min, max)` of the points in cell `h`.
pub fn cell_scores(h: Hash) -> (f64, f64) {
    let min = align52(h);
    let max = align52(Hash {
        bits: h.bits + 1,
        step: h.step,
    });
    (min as f64, max as f64)
}

/// Distance along a meridian (`geohashGetLatDistance`).
fn lat_distance(lat1: f64, lat2: f64) -> f64 {
    EARTH_RADIUS_IN_METERS * (deg_rad(lat2) - deg_rad(lat1)).abs()
}

/// The haversine distance in meters between two points
/// (`geohashGetDistance`).
pub fn distance(lon1: f64, lat1: f64, lon2: f64, lat2: f64) -> f64 {
    let lon1r = deg_rad(lon1);
    let lon2r = deg_rad(lon2);
    let v = ((lon2r - lon1r) / 2.0).sin();
    if v == 0.0 {
        return lat_distance(lat1, lat2);
    }
    let lat1r = deg_rad(lat1);
    let lat2r = deg_rad(lat2);
    let u = ((lat2r - lat1r) / 2.0).sin();
    let a = u * u + lat1r.cos() * lat2r.cos() * v * v;
    2.0 * EARTH_RADIUS_IN_METERS * a.sqrt().asin()
}

/// The distance from the shape's centre to point (`lon`, `lat`) when the
/// point is inside the shape (`geoWithinShape`).
pub fn within(s: &Shape, lon: f64, lat: f64) -> Option<f64> {
    match s.kind {
        ShapeKind::Radius(r) => {
            let d = distance(s.lon, s.lat, lon, lat);
            (d <= r * s.conversion).then_some(d)
        }
        ShapeKind::Box { width, height } => {
            let (w, h) = (width * s.conversion, height * s.conversion);
            if lat_distance(lat, s.lat) > h / 2.0 {
                return None;
            }
            if distance(lon, lat, s.lon, lat) > w / 2.0 {
                return None;
            }
            Some(distance(s.lon, s.lat, lon, lat))
        }
    }
}

/// A distance as Redis replies it: rounded to 4 decimals, half to even
/// (`fixedpoint_d2string(d, 4)`).
pub fn format_distance(d: f64) -> String {
    if d == 0.0 {
        return "0.0000".to_string();
    }
    let v = (d * 10000.0).round_ties_even();
    // C's llrint gives LLONG_MIN for a value beyond the 64-bit range.
    let v = if v.is_finite() && v.abs() < 9.2e18 {
        v as i64
    } else {
        i64::MIN
    };
    let sign = if v < 0 { "-" } else { "" };
    let u = v.unsigned_abs();
    format!("{sign}{}.{:04}", u / 10000, u % 10000)
}

/// A coordinate as Redis replies it: `%.17Lf` with the trailing zeros (and
/// a bare point) removed, `-0` as `0` (`ld2string`'s human mode).
pub fn format_coord(d: f64) -> String {
    if d.is_infinite() {
        return if d > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    let mut s = format!("{d:.17}");
    if s.contains('.') {
        let t = s.trim_end_matches('0').trim_end_matches('.').len();
        s.truncate(t);
    }
    if s == "-0" {
        s = "0".to_string();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    // Reference values from redis-server 7.0.15 (GEOADD, then ZSCORE,
    // GEOPOS, GEOHASH, GEODIST).
    #[test]
    fn scores_positions_and_hashes_match_redis() {
        let s = score_of(13.361389, 38.115556).unwrap();
        assert_eq!(s, 3479099956230698);
        let (lon, lat) = decode_score(s as f64);
        assert_eq!(format_coord(lon), "13.36138933897018433");
        assert_eq!(format_coord(lat), "38.11555639549629859");
        assert_eq!(&geohash_string(s as f64), b"sqc8b49rny0");
        let c = score_of(15.087269, 37.502669).unwrap();
        assert_eq!(c, 3479447370796909);
        let (lon2, lat2) = decode_score(c as f64);
        assert_eq!(format_coord(lon2), "15.08726745843887329");
        assert_eq!(format_coord(lat2), "37.50266842333162032");
        assert_eq!(
            format_distance(distance(lon, lat, lon2, lat2) / 1000.0),
            "166.2742"
        );
        assert_eq!(
            format_distance(distance(lon, lat, lon2, lat2)),
            "166274.1516"
        );
    }

    #[test]
    fn limits_encode_and_decode_as_redis() {
        // GEOADD k 180 85.05112878 a -180 -85.05112878 b 0 0 c: the upper
        // limits give offsets of exactly 2^26, which carry into bits 52
        // and 53, as in Redis.
        let a = score_of(180.0, LAT_MAX).unwrap();
        assert_eq!(a, 13510798882111488);
        assert_eq!(score_of(-180.0, LAT_MIN), Some(0));
        let c = score_of(0.0, 0.0).unwrap();
        assert_eq!(c, 3377699720527872);
        assert_eq!(score_of(180.1, 0.0), None);
        assert_eq!(score_of(0.0, 85.06), None);
        let fmt = |s: u64| {
            let (lon, lat) = decode_score(s as f64);
            (format_coord(lon), format_coord(lat))
        };
        assert_eq!(fmt(a), ("180".into(), "85.0511287799999991".into()));
        assert_eq!(
            fmt(0),
            (
                "-179.99999731779098511".into(),
                "-85.05112751263942528".into()
            )
        );
        assert_eq!(
            fmt(c),
            ("0.00000268220901489".into(), "0.00000126736058093".into())
        );
        assert_eq!(&geohash_string(a as f64), b"bp05b5048p0");
        assert_eq!(&geohash_string(0.0), b"00bh0hbj200");
        assert_eq!(&geohash_string(c as f64), b"s0000000000");
        let (la, pa) = decode_score(a as f64);
        let (lb, pb) = decode_score(0.0);
        let (lc, pc) = decode_score(c as f64);
        assert_eq!(format_distance(distance(la, pa, lc, pc)), "10560811.4940");
        assert_eq!(
            format_distance(distance(lb, pb, lc, pc) / 1000.0),
            "10560.8119"
        );
    }

    #[test]
    fn interleave_round_trips() {
        for (a, b) in [
            (0u32, 0u32),
            (1, 0),
            (0, 1),
            (0x3ff_ffff, 0x155_5555),
            (u32::MAX, 7),
        ] {
            let v = deinterleave(interleave(a, b));
            assert_eq!((v as u32, (v >> 32) as u32), (a, b));
        }
    }

    #[test]
    fn neighbours_wrap_within_the_step() {
        let h = Hash { bits: 0, step: 2 };
        // West of the first cell wraps to the last longitude column.
        assert_eq!(moved(h, -1, 0).bits, 0b1010);
        assert_eq!(moved(h, 0, -1).bits, 0b0101);
        assert_eq!(moved(moved(h, 1, 0), -1, 0), h);
    }

    #[test]
    fn steps_follow_the_radius() {
        assert_eq!(estimate_steps(0.0, 0.0), 26);
        assert_eq!(estimate_steps(200_000.0, 37.0), 6);
        assert_eq!(estimate_steps(200_000.0, 70.0), 5);
        assert_eq!(estimate_steps(200_000.0, 85.0), 4);
        assert_eq!(estimate_steps(1.0, 0.0), 24);
        assert_eq!(estimate_steps(1e9, 0.0), 1);
    }

    #[test]
    fn distances_format_as_fixedpoint() {
        assert_eq!(format_distance(0.0), "0.0000");
        assert_eq!(format_distance(0.00001), "0.0000");
        assert_eq!(format_distance(56.44125), "56.4412");
        assert_eq!(format_distance(1234.5), "1234.5000");
        assert_eq!(format_coord(-0.0), "0");
        assert_eq!(format_coord(2.5), "2.5");
        assert_eq!(format_coord(3.0), "3");
    }
}
