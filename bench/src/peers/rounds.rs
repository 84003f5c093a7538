//! Matched rounds: the floor, the fabric, rrpc and iceoryx2 measured back to back, again
//! and again, so that every ratio compares round trips taken within about a second of
//! each other.
//!
//! On a shared machine the cache-line floor itself drifts: a VM whose two cores move
//! between nearby and distant physical cores sees its floor change fourfold within one
//! invocation. One point per peer can then pair a floor taken at one speed with an rrpc
//! point taken at another, and the ratio means nothing. A round takes its points within
//! about a second; one whose speed changed inside is seen by its two floors and left out
//! ([`Round::mixed`]), and [`group_by_floor`] reports the rounds of each speed apart, so
//! one invocation gives the ratio at every speed the machine ran at.

use serde::Serialize;

/// Two rounds belong to different speeds when their floors differ by more than this
/// factor (with nothing in between). A machine's speeds differ by much more than its
/// run-to-run noise: on this project's test machine the floor is 110 to 140 ns in one
/// and 450 to 550 ns in the other.
pub const SPEED_GAP: f64 = 2.0;

/// The p50 round trips of one round, in nanoseconds, in the order they are measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Round {
    /// Cache-line ping-pong, first; the round's ratios use it.
    pub floor: u64,
    /// One fabric WRITE each way.
    pub fabric: u64,
    /// One rrpc call.
    pub rrpc: u64,
    /// One iceoryx2 request-response.
    pub iceoryx2: u64,
    /// Cache-line ping-pong again, last: only to see whether the speed changed within
    /// the round (see [`Round::mixed`]).
    pub floor_after: u64,
}

/// The ratios of a round's p50s (dimensionless).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Ratios {
    /// rrpc over the cache-line floor.
    pub rrpc_floor: f64,
    /// rrpc over the bare fabric round trip.
    pub rrpc_fabric: f64,
    /// The bare fabric round trip over the cache-line floor.
    pub fabric_floor: f64,
    /// rrpc over iceoryx2.
    pub rrpc_iceoryx2: f64,
}

impl Round {
    /// This round's ratios. A p50 of 0 ns (below the histogram's resolution) counts as
    /// 1 ns, so no ratio is infinite.
    pub fn ratios(&self) -> Ratios {
        let r = |a: u64, b: u64| a as f64 / b.max(1) as f64;
        Ratios {
            rrpc_floor: r(self.rrpc, self.floor),
            rrpc_fabric: r(self.rrpc, self.fabric),
            fabric_floor: r(self.fabric, self.floor),
            rrpc_iceoryx2: r(self.rrpc, self.iceoryx2),
        }
    }

    /// Whether the machine's speed changed within the round: its two floors, measured
    /// first and last, are more than `gap` times apart. (A change and a change
    /// back between them goes unseen; the median over the group outvotes such a round.)
    pub fn mixed(&self, gap: f64) -> bool {
        apart(self.floor, self.floor_after, gap)
    }
}

/// Whether two floors (ns) belong to different speeds: the larger is more than `gap`
/// times the smaller (a floor of 0 ns counts as 1 ns).
fn apart(a: u64, b: u64, gap: f64) -> bool {
    a.max(b) as f64 > gap * a.min(b).max(1) as f64
}

/// Rounds taken at one speed of the machine: their floors lie within [`SPEED_GAP`] of
/// their neighbours'.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Group {
    /// Lowest floor p50 of the group, ns.
    pub floor_min_ns: u64,
    /// Highest floor p50 of the group, ns.
    pub floor_max_ns: u64,
    /// Rounds in the group.
    pub rounds: usize,
    /// The median of each ratio over the group's rounds (each ratio's own median; they
    /// need not come from one round).
    pub median: Ratios,
}

/// [`group_by_floor`]'s answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Grouping {
    /// The rounds of each speed, fastest first.
    pub groups: Vec<Group>,
    /// Rounds left out because the machine's speed changed within them (see
    /// [`Round::mixed`]).
    pub mixed: usize,
}

/// Split `rounds` by speed: the rounds that do not mix speeds (by `gap`, see
/// [`Round::mixed`]), sorted by floor, with a new group where a floor is more than `gap`
/// times the one before it. Groups come fastest first; no rounds give no groups.
pub fn group_by_floor(rounds: &[Round], gap: f64) -> Grouping {
    let mut sorted: Vec<Round> = rounds.iter().copied().filter(|r| !r.mixed(gap)).collect();
    let mixed = rounds.len() - sorted.len();
    sorted.sort_by_key(|r| r.floor);
    let mut groups = Vec::new();
    let mut start = 0;
    for i in 1..=sorted.len() {
        let split = i == sorted.len() || apart(sorted[i - 1].floor, sorted[i].floor, gap);
        if split {
            groups.push(summarize(&sorted[start..i]));
            start = i;
        }
    }
    Grouping { groups, mixed }
}

/// One group's summary; `rounds` is sorted by floor and not empty.
fn summarize(rounds: &[Round]) -> Group {
    let ratios: Vec<Ratios> = rounds.iter().map(Round::ratios).collect();
    let med = |f: fn(&Ratios) -> f64| median(ratios.iter().map(f).collect());
    Group {
        floor_min_ns: rounds[0].floor,
        floor_max_ns: rounds[rounds.len() - 1].floor,
        rounds: rounds.len(),
        median: Ratios {
            rrpc_floor: med(|r| r.rrpc_floor),
            rrpc_fabric: med(|r| r.rrpc_fabric),
            fabric_floor: med(|r| r.fabric_floor),
            rrpc_iceoryx2: med(|r| r.rrpc_iceoryx2),
        },
    }
}

/// One round against perftest (`rrpc-bench peers --perftest --rounds N`): `ib_write_lat`,
/// an rrpc point and `ib_write_lat` again, back to back, between the same two devices.
/// Round trips in nanoseconds (perftest's as `2 x t_typical`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PerftestRound {
    /// `ib_write_lat`'s round trip, first.
    pub write_lat_ns: f64,
    /// rrpc's p50 round trip.
    pub rrpc_ns: u64,
    /// `ib_write_lat`'s round trip again, last.
    pub write_lat_after_ns: f64,
}

impl PerftestRound {
    /// rrpc's p50 over the mean of the two `ib_write_lat` round trips that bracket it.
    pub fn ratio(&self) -> f64 {
        let wl = (self.write_lat_ns + self.write_lat_after_ns) / 2.0;
        self.rrpc_ns as f64 / wl.max(1.0)
    }

    /// Whether the machine's speed changed within the round: its two `ib_write_lat`
    /// round trips are more than `gap` times apart.
    pub fn mixed(&self, gap: f64) -> bool {
        apart(
            self.write_lat_ns.round() as u64,
            self.write_lat_after_ns.round() as u64,
            gap,
        )
    }
}

/// The median of the ratios ([`PerftestRound::ratio`]) of the rounds that did not change
/// speed (by `gap`), and how many were left out; NaN when every round was.
pub fn perftest_median(rounds: &[PerftestRound], gap: f64) -> (f64, usize) {
    let kept: Vec<f64> = rounds
        .iter()
        .filter(|r| !r.mixed(gap))
        .map(PerftestRound::ratio)
        .collect();
    let left_out = rounds.len() - kept.len();
    (median(kept), left_out)
}

/// The median (the mean of the middle two for an even count); NaN for no values.
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(floor: u64, fabric: u64, rrpc: u64) -> Round {
        Round {
            floor,
            fabric,
            rrpc,
            iceoryx2: 1000,
            floor_after: floor + 10,
        }
    }

    #[test]
    fn two_speeds_make_two_groups_each_with_its_own_ratio() {
        // Interleaved as a drifting machine gives them: fast rounds at about 4.5x,
        // slow ones at about 2x.
        let rounds = [
            round(120, 170, 540),
            round(480, 530, 990),
            round(110, 160, 500),
            round(130, 180, 600),
            round(500, 550, 1000),
            round(460, 510, 950),
        ];
        let g = group_by_floor(&rounds, SPEED_GAP);
        assert_eq!(g.mixed, 0);
        let g = g.groups;
        assert_eq!(g.len(), 2, "{g:?}");
        assert_eq!(
            (g[0].floor_min_ns, g[0].floor_max_ns, g[0].rounds),
            (110, 130, 3)
        );
        assert_eq!(
            (g[1].floor_min_ns, g[1].floor_max_ns, g[1].rounds),
            (460, 500, 3)
        );
        // Fast: ratios 4.5, 4.545, 4.615 -> median 4.545.
        assert!((g[0].median.rrpc_floor - 500.0 / 110.0).abs() < 1e-9);
        // Slow: 2.0, 2.0625, 2.065 -> median 2.0625; fabric/floor 1.1, 1.104, 1.109.
        assert!((g[1].median.rrpc_floor - 990.0 / 480.0).abs() < 1e-9);
        assert!((g[1].median.fabric_floor - 530.0 / 480.0).abs() < 1e-9);
        // Pooling both speeds would have given a median between them, true of neither.
        let pooled = median(rounds.iter().map(|r| r.ratios().rrpc_floor).collect());
        assert!(pooled > 2.1 && pooled < 4.5, "{pooled}");
    }

    #[test]
    fn one_speed_is_one_group_and_nothing_is_nothing() {
        let rounds = [
            round(110, 170, 520),
            round(140, 180, 560),
            round(120, 170, 530),
        ];
        let g = group_by_floor(&rounds, SPEED_GAP).groups;
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].rounds, 3);
        // rrpc/fabric 3.059, 3.111, 3.118 -> median 3.111.
        assert!((g[0].median.rrpc_fabric - 560.0 / 180.0).abs() < 1e-9);
        let none = group_by_floor(&[], SPEED_GAP);
        assert!(none.groups.is_empty() && none.mixed == 0);
    }

    #[test]
    fn rounds_whose_speed_changed_are_left_out() {
        // Seen on this machine: the first floor at the slow speed and the rest at the fast
        // one (floor 450, fabric 180, rrpc 560), and the other way round (floor 110,
        // fabric 550, rrpc 951). Kept, the first would join the slow group with a ratio
        // of 1.24 and the second make a "fast" group of its own at 8.65, true of no speed.
        let rounds = [
            round(460, 540, 1010),
            Round {
                floor_after: 120,
                ..round(450, 180, 560)
            },
            round(450, 530, 990),
            Round {
                floor_after: 480,
                ..round(110, 550, 951)
            },
        ];
        let mixed: Vec<bool> = rounds.iter().map(|r| r.mixed(SPEED_GAP)).collect();
        assert_eq!(mixed, [false, true, false, true]);
        let g = group_by_floor(&rounds, SPEED_GAP);
        assert_eq!(g.mixed, 2);
        assert_eq!(g.groups.len(), 1, "{g:?}");
        assert_eq!(g.groups[0].rounds, 2);
        assert!(
            (g.groups[0].median.rrpc_floor - (1010.0 / 460.0 + 990.0 / 450.0) / 2.0).abs() < 1e-9
        );
    }

    #[test]
    fn a_zero_p50_gives_a_finite_ratio() {
        let r = round(0, 0, 500).ratios();
        assert_eq!(r.rrpc_floor, 500.0);
        assert!(r.fabric_floor.is_finite());
    }

    #[test]
    fn perftest_rounds_take_the_median_of_the_rounds_that_kept_their_speed() {
        let r = |a: f64, rrpc: u64, b: f64| PerftestRound {
            write_lat_ns: a,
            rrpc_ns: rrpc,
            write_lat_after_ns: b,
        };
        // Ratios 1.2, 1.5 and 1.1 (against the mean of the bracketing pair); the fourth
        // round's perftest slowed 3x inside it and is left out.
        let rounds = [
            r(40_000.0, 48_000, 40_000.0),
            r(70_000.0, 120_000, 90_000.0),
            r(50_000.0, 55_000, 50_000.0),
            r(40_000.0, 400_000, 120_000.0),
        ];
        assert!((rounds[1].ratio() - 1.5).abs() < 1e-9);
        assert!(rounds[3].mixed(SPEED_GAP) && !rounds[1].mixed(SPEED_GAP));
        let (m, left_out) = perftest_median(&rounds, SPEED_GAP);
        assert!((m - 1.2).abs() < 1e-9, "{m}");
        assert_eq!(left_out, 1);
        let (m, left_out) = perftest_median(&rounds[3..], SPEED_GAP);
        assert!(m.is_nan() && left_out == 1);
    }
}
