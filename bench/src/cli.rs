//! The command-line convention of the benchmark binaries (`txn-bench` and its
//! `--suite rcc`, `rrpc-bench`, `lock-bench`, `tso-bench`, `index-bench`): the argument
//! groups every one of them flattens into its parser, with the same names, units and
//! meanings, the parsing entry point that sets a binary's own defaults, and the exit-code
//! rule.
//!
//! - [`FabricArgs`] holds `--fabric`, `--model`, with one default rule ([`FabricArgs::model`]).
//! - [`RunLength`] holds `--duration`, `--warmup` with units ([`Span`]: `10s`, `500ms`, `2m`,
//!   a bare number is seconds); `--duration-ms` / `--warmup-ms` are hidden aliases in
//!   milliseconds, kept for old scripts.
//! - [`SeedArg`] holds `--seed`.
//! - [`ConfigArg`] holds `--config FILE.toml` (see [`crate::config_file`]).
//! - [`OutputArgs`] holds `--json PATH` (JSON Lines, see [`crate::jsonl`]), `--chart PATH`
//!   (`--plot` a hidden alias).
//!
//! Exit codes, the same in every binary ([`exit_code`]): 0 success, 1 a failed check or
//! a run-time error, 2 a usage error (clap's parse errors, and the flag or config-file
//! errors found before anything runs, marked with [`usage`]). Logging: `warn` unless
//! `RUST_LOG` says otherwise ([`init_logging`]).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use rrpc::fabric::FabricKind;
use serde::{Deserialize, Serialize};

/// A length of time on the command line: a number with a unit (`ns`, `us`, `ms`, `s`,
/// `m`, `h`; `1.5s` and `250ms` alike), or a bare number, which is seconds (`3`, `0.5`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct Span(pub Duration);

/// Why a [`Span`] did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid time {given:?}: {why} (expected e.g. 10s, 500ms, 2m, 250us, or a bare number of seconds)")]
pub struct SpanError {
    /// The text given.
    pub given: String,
    /// What is wrong with it.
    pub why: &'static str,
}

/// Parse `s` as a [`Span`]'s duration (see there). Errors: empty text, a number that
/// does not parse or is negative, NaN or too large, an unknown unit.
pub fn parse_duration(s: &str) -> Result<Duration, SpanError> {
    let bad = |why| SpanError {
        given: s.to_string(),
        why,
    };
    let t = s.trim();
    if t.is_empty() {
        return Err(bad("empty"));
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(bad("no number"));
    }
    let n: f64 = num.parse().map_err(|_| bad("not a number"))?;
    let secs_per_unit = match unit.trim() {
        "" | "s" | "sec" | "secs" => 1.0,
        "ms" => 1e-3,
        "us" | "µs" => 1e-6,
        "ns" => 1e-9,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return Err(bad("unknown unit (ns, us, ms, s, m, h)")),
    };
    Duration::try_from_secs_f64(n * secs_per_unit).map_err(|_| bad("out of range"))
}

impl FromStr for Span {
    type Err = SpanError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_duration(s).map(Span)
    }
}

impl fmt::Display for Span {
    /// The largest unit that shows the value exactly: `10s`, `500ms`, `250us`, `7ns`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.0.as_nanos();
        if ns == 0 {
            write!(f, "0s")
        } else if ns.is_multiple_of(1_000_000_000) {
            write!(f, "{}s", ns / 1_000_000_000)
        } else if ns.is_multiple_of(1_000_000) {
            write!(f, "{}ms", ns / 1_000_000)
        } else if ns.is_multiple_of(1_000) {
            write!(f, "{}us", ns / 1_000)
        } else {
            write!(f, "{ns}ns")
        }
    }
}

impl From<Span> for String {
    fn from(s: Span) -> String {
        s.to_string()
    }
}

impl TryFrom<String> for Span {
    type Error = SpanError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

/// `--fabric` and `--model`.
#[derive(clap::Args, Debug, Clone, Serialize, Deserialize)]
pub struct FabricArgs {
    /// Fabric backend: shm, or verbs (RDMA NICs, Soft-RoCE; needs a build with
    /// `--features rrpc/verbs`).
    #[arg(
        long,
        global = true,
        env = "RRPC_FABRIC",
        default_value = "shm",
        value_name = "KIND"
    )]
    pub fabric: FabricKind,
    /// Timing model of the shm fabric: none, cx5, cx6, rxe, cx3-scaled (built-in RNIC
    /// profiles) or the path of a TOML profile. Default: $RRPC_MODEL, else cx5 on shm;
    /// none on verbs (a real NIC has its own timing; verbs refuses a model).
    #[arg(long, global = true, value_name = "MODEL")]
    #[serde(default)]
    pub model: Option<String>,
}

impl FabricArgs {
    /// The timing model that runs: `--model` if given (an error on verbs unless `none`);
    /// else on shm `$RRPC_MODEL` if set, else `cx5`; on verbs `none` (`$RRPC_MODEL` is
    /// not read there, so that a shell set up for shm runs does not break verbs runs).
    ///
    /// One rule for every binary: on instant shared memory a contended lock or an FAA
    /// measures cache lines, not a network, so the shm default is an RNIC's timing.
    ///
    /// Errors: a model other than `none` with `--fabric verbs`.
    pub fn model(&self) -> anyhow::Result<String> {
        let env = std::env::var("RRPC_MODEL").ok().filter(|m| !m.is_empty());
        match (self.fabric, &self.model) {
            (FabricKind::Verbs, Some(m)) if m != "none" => Err(usage(format!(
                "--model {m}: a timing model runs on the shm fabric only, not on verbs"
            ))),
            (_, Some(m)) => Ok(m.clone()),
            (FabricKind::Shm, None) => Ok(env.unwrap_or_else(|| "cx5".into())),
            (FabricKind::Verbs, None) => Ok("none".into()),
        }
    }
}

/// `--config FILE.toml`: the binary's settings from a file (see [`crate::config_file`]):
/// top-level keys are its long flags, a `[fabric]` table holds `kind` (`--fabric`) and
/// `model` (`--model`), `[runtime]` and `[server]` tables hold rrpc's settings
/// ([`ConfigArg::rpc_settings`]); flags on the command line win over the file.
#[derive(clap::Args, Debug, Clone, Default, Serialize, Deserialize)]
pub struct ConfigArg {
    /// TOML file of settings: top-level keys are this command's long flags and its
    /// subcommand's (`duration = "5s"`, `threads = 4`), a `[fabric]` table holds kind
    /// (--fabric) and model (--model), `[runtime]` and `[server]` tables hold rrpc's
    /// runtime and server settings (`call-timeout-ms`, `max-ring-bytes`, ...). Flags on
    /// the command line win over the file.
    #[arg(long, global = true, value_name = "FILE.toml")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<PathBuf>,
}

/// `--duration` and `--warmup` (and their hidden millisecond aliases).
#[derive(clap::Args, Debug, Clone, Serialize, Deserialize)]
pub struct RunLength {
    /// Measured time of each run or data point: 10s, 500ms, 2m, ...; a bare number is
    /// seconds.
    #[arg(long, global = true, default_value = "10s", value_name = "TIME")]
    pub duration: Span,
    /// Warm-up before each data point, not measured; units as --duration. txn-bench
    /// (and its suites) runs each run's warm-up on its freshly loaded cluster, reports
    /// what follows it and checks the whole run.
    #[arg(long, global = true, default_value = "0s", value_name = "TIME")]
    pub warmup: Span,
    /// Old spelling of --duration, in milliseconds.
    #[arg(
        long,
        global = true,
        hide = true,
        conflicts_with = "duration",
        value_name = "MS"
    )]
    #[serde(skip)]
    pub duration_ms: Option<u64>,
    /// Old spelling of --warmup, in milliseconds.
    #[arg(
        long,
        global = true,
        hide = true,
        conflicts_with = "warmup",
        value_name = "MS"
    )]
    #[serde(skip)]
    pub warmup_ms: Option<u64>,
}

impl RunLength {
    /// The measured time (`--duration`, or the old `--duration-ms`).
    pub fn duration(&self) -> Duration {
        self.duration_ms
            .map_or(self.duration.0, Duration::from_millis)
    }
    /// The warm-up (`--warmup`, or the old `--warmup-ms`).
    pub fn warmup(&self) -> Duration {
        self.warmup_ms.map_or(self.warmup.0, Duration::from_millis)
    }
    /// [`Self::duration`] in seconds.
    pub fn secs(&self) -> f64 {
        self.duration().as_secs_f64()
    }
    /// Fold the old millisecond spellings into `duration` and `warmup` (so that the
    /// values survive serialization, which skips the aliases).
    pub fn normalize(&mut self) {
        self.duration = Span(self.duration());
        self.warmup = Span(self.warmup());
        self.duration_ms = None;
        self.warmup_ms = None;
    }
    /// Errors (usage): a zero duration.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.duration().is_zero() {
            return Err(usage("--duration must be more than 0"));
        }
        Ok(())
    }
}

/// `--seed`.
#[derive(clap::Args, Debug, Clone, Copy, Serialize, Deserialize)]
pub struct SeedArg {
    /// RNG seed (every random choice derives from it; the same seed, the same choices).
    #[arg(long, global = true, default_value_t = 1)]
    pub seed: u64,
}

/// `--json` and `--chart`.
#[derive(clap::Args, Debug, Clone, Default, Serialize, Deserialize)]
pub struct OutputArgs {
    /// Write JSON Lines to this file: a metadata record first (version, git revision,
    /// host, fabric, model, command line, seed, ...), then one record per data point or
    /// run, flushed as soon as it is measured, then the summary.
    #[arg(long, global = true, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// Draw the chart to this file (.svg or .png; what it shows: see the command's
    /// description). `--plot` is an old spelling.
    #[arg(long, global = true, value_name = "PATH", alias = "plot")]
    pub chart: Option<PathBuf>,
}

/// An error in the flags or a config file, found before anything ran: exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// A usage error (exit code 2) as an `anyhow::Error`.
pub fn usage(msg: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(UsageError(msg.into()))
}

/// Mark any error of `r` as a usage error (exit code 2), keeping its message chain.
pub fn as_usage<T, E: Into<anyhow::Error>>(r: Result<T, E>) -> anyhow::Result<T> {
    r.map_err(|e| {
        let e: anyhow::Error = e.into();
        if e.is::<UsageError>() {
            e
        } else {
            usage(format!("{e:#}"))
        }
    })
}

/// The exit code for an error: 2 for a [`UsageError`] anywhere in its chain, 1 otherwise.
pub fn exit_code(e: &anyhow::Error) -> i32 {
    if e.chain().any(|c| c.is::<UsageError>()) {
        2
    } else {
        1
    }
}

/// Log to stderr at `warn` unless `RUST_LOG` says otherwise (every benchmark binary).
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
}

/// `A`'s parser with the default values of the arguments named in `defaults` replaced
/// (see [`try_parse_from`]).
pub fn command_with_defaults<A: clap::CommandFactory>(
    defaults: &[(&'static str, &'static str)],
) -> clap::Command {
    let mut cmd = A::command();
    for &(id, v) in defaults {
        cmd = cmd.mut_arg(id, |a| a.default_value(v));
    }
    cmd
}

/// Parse `argv` (program name first) with `A`'s parser after replacing the default
/// values of the arguments named in `defaults` (`("duration", "1s")`): the shared groups
/// carry one default, a binary its own where that matters; `--help` shows the binary's.
///
/// Errors: clap's (print with `clap::Error::exit`: code 2, or 0 for `--help`).
pub fn try_parse_from<A, I, T>(
    argv: I,
    defaults: &[(&'static str, &'static str)],
) -> clap::error::Result<A>
where
    A: clap::Parser,
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let mut m = command_with_defaults::<A>(defaults).try_get_matches_from(argv)?;
    A::from_arg_matches_mut(&mut m).map_err(|e| e.format(&mut A::command()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn durations_take_units() {
        let d = |s: &str| parse_duration(s).unwrap();
        assert_eq!(d("10s"), Duration::from_secs(10));
        assert_eq!(d("500ms"), Duration::from_millis(500));
        assert_eq!(d("2m"), Duration::from_secs(120));
        assert_eq!(d("3"), Duration::from_secs(3));
        assert_eq!(d("0.5"), Duration::from_millis(500));
        assert_eq!(d("1.5s"), Duration::from_millis(1500));
        assert_eq!(d("250us"), Duration::from_micros(250));
        assert_eq!(d("1h"), Duration::from_secs(3600));
        for bad in ["", "ms", "10x", "-1s", "1..2s", "s10", "1e999"] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.to_string().contains("invalid time"), "{bad}: {e}");
            assert!(e.to_string().contains("500ms"), "{bad}: {e}");
        }
        for s in ["10s", "500ms", "250us", "7ns", "0s", "1500ms"] {
            assert_eq!(s.parse::<Span>().unwrap().to_string(), s);
        }
        let j = serde_json::to_string(&Span(Duration::from_millis(1500))).unwrap();
        assert_eq!(j, "\"1500ms\"");
        assert_eq!(
            serde_json::from_str::<Span>(&j).unwrap().0,
            Duration::from_millis(1500)
        );
    }

    #[derive(Parser, Debug)]
    struct Demo {
        #[command(flatten)]
        run: RunLength,
        #[command(flatten)]
        fabric: FabricArgs,
        #[command(flatten)]
        out: OutputArgs,
        #[command(flatten)]
        seed: SeedArg,
    }

    #[test]
    fn groups_parse_with_per_binary_defaults_and_old_spellings() {
        let p = |a: &[&str]| try_parse_from::<Demo, _, _>(a, &[("duration", "1s")]);
        let d = p(&["x"]).unwrap();
        assert_eq!(d.run.duration(), Duration::from_secs(1));
        assert_eq!(d.run.warmup(), Duration::ZERO);
        assert_eq!(d.seed.seed, 1);
        let d = p(&["x", "--duration", "2m", "--warmup", "300ms", "--seed", "7"]).unwrap();
        assert_eq!(d.run.duration(), Duration::from_secs(120));
        assert_eq!(d.run.warmup(), Duration::from_millis(300));
        assert_eq!(d.seed.seed, 7);
        let mut d = p(&[
            "x",
            "--duration-ms",
            "250",
            "--warmup-ms",
            "50",
            "--plot",
            "a.svg",
        ])
        .unwrap();
        assert_eq!(d.run.duration(), Duration::from_millis(250));
        assert_eq!(d.out.chart, Some(PathBuf::from("a.svg")));
        d.run.normalize();
        assert_eq!(d.run.duration, Span(Duration::from_millis(250)));
        assert_eq!(d.run.warmup, Span(Duration::from_millis(50)));
        let e = p(&["x", "--duration", "ten"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("invalid time"), "{e}");
        assert!(p(&["x", "--duration", "1s", "--duration-ms", "5"]).is_err());
    }

    #[test]
    fn usage_errors_exit_2_others_1() {
        assert_eq!(exit_code(&usage("bad flag")), 2);
        assert_eq!(exit_code(&usage("bad flag").context("while starting")), 2);
        assert_eq!(exit_code(&anyhow::anyhow!("the service died")), 1);
        assert_eq!(
            exit_code(&as_usage::<(), _>(Err(anyhow::anyhow!("x"))).unwrap_err()),
            2
        );
    }
}
