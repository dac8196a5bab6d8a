//! Redis's partial quicksort (`pqsort.c`: Bentley and McIlroy's qsort that
//! skips the partitions outside a wanted index range). Redis uses it where
//! a reply needs only a window of the sorted items (GEOSEARCH ... COUNT, SORT
//! BY ... LIMIT); the order it leaves equal items in is its own, so Ember
//! runs the same steps to answer those requests with the same order.

use std::cmp::Ordering;

fn med3<T>(
    v: &[T],
    a: usize,
    b: usize,
    c: usize,
    cmp: &mut impl FnMut(&T, &T) -> Ordering,
) -> usize {
    if cmp(&v[a], &v[b]) == Ordering::Less {
        if cmp(&v[b], &v[c]) == Ordering::Less {
            b
        } else if cmp(&v[a], &v[c]) == Ordering::Less {
            c
        } else {
            a
        }
    } else if cmp(&v[b], &v[c]) == Ordering::Greater {
        b
    } else if cmp(&v[a], &v[c]) == Ordering::Less {
        a
    } else {
        c
    }
}

/// Swaps the `n` items from `a` with the `n` items from `b`.
fn vecswap<T>(v: &mut [T], a: usize, b: usize, n: usize) {
    for i in 0..n {
        v.swap(a + i, b + i);
    }
}

/// Sorts `v` enough that its items `lo..=hi` are those, in that order,
/// that a full sort by `cmp` puts there (equal items in Redis's order).
/// `lo <= hi < v.len()`.
pub fn pqsort<T>(v: &mut [T], lo: usize, hi: usize, mut cmp: impl FnMut(&T, &T) -> Ordering) {
    let n = v.len();
    partition(v, 0, n, lo, hi, &mut cmp);
}

/// Sorts the partition `[a, a + n)` of `v` (`_pqsort`); `lo` and `hi` stay
/// indexes into the whole of `v`.
fn partition<T>(
    v: &mut [T],
    mut a: usize,
    mut n: usize,
    lo: usize,
    hi: usize,
    cmp: &mut impl FnMut(&T, &T) -> Ordering,
) {
    // A partition [a, a + n) is sorted unless the wanted range lies wholly
    // before or after it.
    let wanted = |a: usize, n: usize| !((lo < a && hi < a) || (lo >= a + n && hi >= a + n));
    loop {
        if n < 7 {
            for pm in a + 1..a + n {
                let mut pl = pm;
                while pl > a && cmp(&v[pl - 1], &v[pl]) == Ordering::Greater {
                    v.swap(pl, pl - 1);
                    pl -= 1;
                }
            }
            return;
        }
        let mut pm = a + n / 2;
        if n > 7 {
            let mut pl = a;
            let mut pn = a + n - 1;
            if n > 40 {
                let d = n / 8;
                pl = med3(v, pl, pl + d, pl + 2 * d, cmp);
                pm = med3(v, pm - d, pm, pm + d, cmp);
                pn = med3(v, pn - 2 * d, pn - d, pn, cmp);
            }
            pm = med3(v, pl, pm, pn, cmp);
        }
        v.swap(a, pm);
        let (mut pa, mut pb) = (a + 1, a + 1);
        // Signed: `pc` may step one below `pb`.
        let (mut pc, mut pd) = ((a + n - 1) as isize, (a + n - 1) as isize);
        loop {
            while pb as isize <= pc {
                let c = cmp(&v[pb], &v[a]);
                if c == Ordering::Greater {
                    break;
                }
                if c == Ordering::Equal {
                    v.swap(pa, pb);
                    pa += 1;
                }
                pb += 1;
            }
            while pb as isize <= pc {
                let c = cmp(&v[pc as usize], &v[a]);
                if c == Ordering::Less {
                    break;
                }
                if c == Ordering::Equal {
                    v.swap(pc as usize, pd as usize);
                    pd -= 1;
                }
                pc -= 1;
            }
            if pb as isize > pc {
                break;
            }
            v.swap(pb, pc as usize);
            pb += 1;
            pc -= 1;
        }
        let pn = a + n;
        let r = (pa - a).min(pb - pa);
        vecswap(v, a, pb - r, r);
        let r = ((pd - pc) as usize).min(pn - pd as usize - 1);
        vecswap(v, pb, pn - r, r);
        let r = pb - pa;
        if r > 1 && wanted(a, r) {
            partition(v, a, r, lo, hi, cmp);
        }
        let r = (pd - pc) as usize;
        if r > 1 {
            a = pn - r;
            n = r;
            if wanted(a, n) {
                continue;
            }
        }
        return;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::{RngExt, SeedableRng};

    #[test]
    fn the_window_is_sorted() {
        let mut rng = SmallRng::seed_from_u64(7);
        for _ in 0..2000 {
            let n = rng.random_range(1..120);
            let v: Vec<u32> = (0..n).map(|_| rng.random_range(0..30)).collect();
            let lo = rng.random_range(0..n);
            let hi = rng.random_range(lo..n);
            let mut got = v.clone();
            pqsort(&mut got, lo, hi, |a, b| a.cmp(b));
            let mut want = v.clone();
            want.sort();
            assert_eq!(got[lo..=hi], want[lo..=hi], "{v:?} {lo}..={hi}");
            let mut all = got.clone();
            all.sort();
            assert_eq!(all, want);
        }
    }

    #[test]
    fn equal_items_keep_redis_order() {
        // (n, mod, mul, add, lo, hi, tags): items keyed (i * mul + add) % mod
        // and tagged i, compared by key only, leave Redis's pqsort.c (built
        // from 7.0.15's source) with their tags in this order.
        type Case = (usize, usize, usize, usize, usize, usize, &'static [usize]);
        let cases: &[Case] = &[
            (12, 3, 1, 0, 0, 4, &[0, 3, 6, 9, 10, 1, 7, 4, 11, 5, 8, 2]),
            (
                50,
                5,
                7,
                3,
                3,
                9,
                &[
                    31, 21, 46, 26, 6, 1, 41, 11, 36, 16, 19, 4, 49, 29, 24, 39, 14, 34, 44, 9, 37,
                    2, 7, 12, 17, 22, 27, 32, 42, 47, 30, 20, 3, 33, 18, 35, 15, 0, 38, 13, 40, 10,
                    48, 43, 8, 45, 25, 5, 28, 23,
                ],
            ),
            (
                100,
                7,
                13,
                1,
                10,
                20,
                &[
                    57, 85, 71, 29, 50, 78, 64, 22, 8, 92, 43, 36, 99, 1, 15, 84, 56, 7, 49, 91,
                    14, 98, 21, 77, 28, 0, 70, 35, 63, 42, 48, 62, 6, 13, 34, 41, 90, 20, 69, 76,
                    97, 27, 55, 83, 75, 5, 12, 19, 26, 33, 40, 47, 54, 61, 68, 82, 89, 96, 58, 59,
                    60, 95, 44, 39, 38, 65, 66, 67, 2, 37, 32, 31, 72, 73, 74, 30, 25, 24, 23, 79,
                    80, 81, 4, 18, 17, 16, 86, 87, 88, 3, 11, 10, 9, 93, 52, 53, 94, 51, 46, 45,
                ],
            ),
            (
                64,
                4,
                5,
                2,
                60,
                63,
                &[
                    2, 47, 34, 35, 59, 46, 38, 39, 10, 43, 42, 11, 3, 58, 14, 15, 63, 55, 18, 19,
                    62, 54, 22, 23, 6, 51, 26, 27, 7, 50, 30, 31, 40, 4, 8, 12, 16, 20, 24, 28, 32,
                    36, 0, 44, 48, 52, 56, 60, 33, 49, 29, 25, 61, 53, 21, 17, 5, 57, 13, 41, 9,
                    45, 37, 1,
                ],
            ),
            (9, 2, 1, 0, 0, 0, &[8, 2, 4, 6, 0, 1, 5, 3, 7]),
            (
                150,
                11,
                17,
                5,
                0,
                20,
                &[
                    133, 111, 23, 122, 78, 45, 144, 89, 100, 1, 34, 67, 12, 56, 146, 58, 135, 14,
                    124, 25, 113, 3, 102, 36, 91, 69, 47, 80, 128, 29, 106, 71, 104, 49, 137, 139,
                    62, 95, 38, 93, 40, 51, 73, 7, 84, 18, 60, 148, 126, 117, 16, 115, 82, 5, 27,
                    75, 9, 20, 31, 42, 53, 64, 86, 97, 108, 119, 130, 141, 68, 55, 70, 54, 72, 52,
                    74, 0, 76, 77, 50, 79, 48, 81, 46, 83, 44, 85, 6, 87, 88, 43, 90, 41, 92, 39,
                    94, 37, 96, 145, 98, 99, 35, 101, 33, 103, 32, 105, 30, 107, 4, 109, 110, 28,
                    112, 26, 114, 24, 116, 22, 118, 147, 120, 121, 21, 123, 19, 125, 17, 127, 15,
                    129, 2, 131, 132, 13, 134, 11, 136, 10, 138, 8, 140, 149, 142, 61, 59, 63, 143,
                    65, 66, 57,
                ],
            ),
        ];
        for &(n, m, mul, add, lo, hi, want) in cases {
            let mut v: Vec<(usize, usize)> = (0..n).map(|i| ((i * mul + add) % m, i)).collect();
            pqsort(&mut v, lo, hi, |a, b| a.0.cmp(&b.0));
            let tags: Vec<usize> = v.iter().map(|x| x.1).collect();
            assert_eq!(tags, want, "n {n} window {lo}..={hi}");
        }
    }
}
