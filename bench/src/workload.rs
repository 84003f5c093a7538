//! The `--workload` choice of `txn-bench`: SmallBank ([`crate::smallbank`]), the KVS /
//! YCSB family ([`crate::ycsb`]), TATP ([`crate::tatp`]) and TPC-C ([`crate::tpcc`]).

use std::fmt;
use std::str::FromStr;

/// The `--workload` flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// SmallBank (the default).
    SmallBank,
    /// The papers' KVS: one read or update per transaction, half each.
    Kvs,
    /// YCSB A: 50% reads, 50% updates.
    YcsbA,
    /// YCSB B: 95% reads, 5% updates.
    YcsbB,
    /// YCSB C: reads only.
    YcsbC,
    /// YCSB D: 95% reads of the latest keys, 5% inserts of new keys.
    YcsbD,
    /// YCSB F: 50% reads, 50% read-modify-writes.
    YcsbF,
    /// TATP: seven transaction types, 80% reads, non-uniform subscriber ids.
    Tatp,
    /// TPC-C: five transaction types in the standard mix (45/43/4/4/4).
    Tpcc,
}

impl FromStr for Workload {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "smallbank" => Self::SmallBank,
            "kvs" => Self::Kvs,
            "ycsb-a" => Self::YcsbA,
            "ycsb-b" => Self::YcsbB,
            "ycsb-c" => Self::YcsbC,
            "ycsb-d" => Self::YcsbD,
            "ycsb-f" => Self::YcsbF,
            "tatp" => Self::Tatp,
            "tpcc" | "tpc-c" => Self::Tpcc,
            "ycsb-e" => {
                return Err("ycsb-e needs range scans, which none of the protocols \
                            (occ-cas, scythe, mvcc) supports: use ycsb-a, ycsb-b, ycsb-c, \
                            ycsb-d, ycsb-f or kvs"
                    .into())
            }
            _ => {
                return Err(format!(
                    "unknown workload {s:?}: smallbank, kvs, ycsb-a, ycsb-b, ycsb-c, ycsb-d, \
                     ycsb-f, tatp or tpcc"
                ))
            }
        })
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Workload {
    /// The flag's spelling.
    pub fn name(self) -> &'static str {
        match self {
            Self::SmallBank => "smallbank",
            Self::Kvs => "kvs",
            Self::YcsbA => "ycsb-a",
            Self::YcsbB => "ycsb-b",
            Self::YcsbC => "ycsb-c",
            Self::YcsbD => "ycsb-d",
            Self::YcsbF => "ycsb-f",
            Self::Tatp => "tatp",
            Self::Tpcc => "tpcc",
        }
    }

    /// The workload as reports name it (`SmallBank`, `ycsb-a`, `TATP`, `TPC-C`).
    pub fn label(self) -> &'static str {
        match self {
            Self::SmallBank => "SmallBank",
            Self::Tatp => "TATP",
            Self::Tpcc => "TPC-C",
            w => w.name(),
        }
    }

    /// Whether the workload runs on the KVS table (`kvs` and the YCSB presets).
    pub fn is_kvs(self) -> bool {
        !matches!(self, Self::SmallBank | Self::Tatp | Self::Tpcc)
    }

    /// Whether Zipf theta (`--theta`, `--sweep theta=`) shapes the key choice: TATP and
    /// TPC-C draw keys by their specifications' non-uniform rules instead.
    pub fn uses_theta(self) -> bool {
        !matches!(self, Self::Tatp | Self::Tpcc)
    }

    /// Transaction kinds as the report lists them (index = the history's kind). KVS /
    /// YCSB: read-only transactions first, then those that write.
    pub fn kinds(self) -> Vec<&'static str> {
        match self {
            Self::SmallBank => crate::smallbank::TxnType::ALL
                .iter()
                .map(|t| t.name())
                .collect(),
            Self::Tatp => crate::tatp::TxnType::ALL.iter().map(|t| t.name()).collect(),
            Self::Tpcc => crate::tpcc::TxnType::ALL.iter().map(|t| t.name()).collect(),
            Self::Kvs => vec!["read", "update"],
            Self::YcsbA | Self::YcsbB => vec!["read-only", "update"],
            Self::YcsbC => vec!["read-only"],
            Self::YcsbD => vec!["read-only", "insert"],
            Self::YcsbF => vec!["read-only", "read-modify-write"],
        }
    }

    /// KVS / YCSB: percent of operations that write (update, read-modify-write or
    /// insert); 0 for the other workloads.
    pub fn write_percent(self) -> u32 {
        match self {
            Self::SmallBank | Self::Tatp | Self::Tpcc | Self::YcsbC => 0,
            Self::Kvs | Self::YcsbA | Self::YcsbF => 50,
            Self::YcsbB | Self::YcsbD => 5,
        }
    }

    /// KVS / YCSB operations per transaction without `--ops-per-txn`: 1 for kvs, 4 for
    /// YCSB.
    pub fn default_ops(self) -> usize {
        if self == Self::Kvs {
            1
        } else {
            4
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_flag() {
        assert_eq!("ycsb-a".parse::<Workload>(), Ok(Workload::YcsbA));
        assert_eq!("kvs".parse::<Workload>().unwrap().default_ops(), 1);
        assert_eq!("tpc-c".parse::<Workload>(), Ok(Workload::Tpcc));
        let e = "ycsb-e".parse::<Workload>().unwrap_err();
        assert!(e.contains("range scans"), "{e}");
        assert!("ycsb-z".parse::<Workload>().is_err());
        for w in [
            "smallbank",
            "kvs",
            "ycsb-a",
            "ycsb-b",
            "ycsb-c",
            "ycsb-d",
            "ycsb-f",
            "tatp",
            "tpcc",
        ] {
            let parsed = w.parse::<Workload>().unwrap();
            assert_eq!(parsed.name(), w);
            assert!(!parsed.kinds().is_empty(), "{w} has no kinds");
        }
        assert_eq!(Workload::Tatp.kinds().len(), 7);
        assert_eq!(Workload::Tpcc.kinds().len(), 5);
        assert!(!Workload::Tatp.is_kvs() && !Workload::Tatp.uses_theta());
    }
}
