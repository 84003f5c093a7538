//! `--config FILE.toml` for the benchmark binaries: a file whose keys are the command's
//! long flags (kebab-case, or snake_case, which is read as kebab-case), and a `[fabric]`
//! table (`kind`, `model`: the shared fabric flags), turned into flags that go before
//! the command line's own, so that the command line wins (the command lets a flag
//! override itself: clap's `args_override_self`). The service binaries' files have the
//! same shape (`rrpc::settings_file`), where `[runtime]` and `[server]` apply too.

use std::path::{Path, PathBuf};

/// Why a `--config` file could not be used, or the command line did not parse.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// clap's error for the command line (also `--help` and `--version`).
    #[error("{0}")]
    Clap(clap::Error),
    /// The file cannot be read.
    #[error("reading {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not TOML, holds a value that is not a flag's, or a key is not a flag.
    #[error("in {}: {why}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
}

/// The flags `path` stands for in command `cmd` (a subcommand after
/// `clap::Command::build`, so that it holds the global flags too; `name` names it in
/// errors): `key = "v"` / `key = 3` / `key = 0.5`
/// as `--key v`, `key = true` as `--key` (a switch), `key = false` as nothing; a
/// `[fabric]` table's keys as the shared fabric flags (`kind` as `--fabric`, `model` as
/// `--model`, any other key as the flag of its name where `cmd` has one).
///
/// Errors (each naming the file, and the table and key): an unreadable or malformed
/// file; a top-level key that is not a long flag of `cmd`, or is `config`; a value that
/// is a table, an array or a date; a `[fabric]` key `cmd` has no flag for; a `[runtime]`
/// or `[server]` table (the benchmark binaries build their rrpc settings from their own
/// flags: those tables are for the service binaries' files and topology files, and are
/// refused rather than ignored).
pub fn config_flags(
    path: &Path,
    cmd: &clap::Command,
    name: &str,
) -> Result<Vec<String>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let bad = |why: String| ConfigError::File {
        path: path.to_path_buf(),
        why,
    };
    let has_flag = |long: &str| cmd.get_arguments().any(|a| a.get_long() == Some(long));
    let table: toml::Table = toml::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let mut flags = Vec::new();
    for (key, value) in table {
        if let ("fabric", toml::Value::Table(t)) = (key.as_str(), &value) {
            for (k, v) in t {
                let long = match k.replace('_', "-").as_str() {
                    "kind" => "fabric".to_string(),
                    other => other.to_string(),
                };
                if long == "fabric" && k != "kind" || !has_flag(&long) {
                    return Err(bad(format!(
                        "[fabric]: `{k}`: {name} has no such fabric setting (it takes kind \
                         and model: --fabric and --model)"
                    )));
                }
                push_flag(
                    &mut flags,
                    &format!("--{long}"),
                    &format!("[fabric]: `{k}`"),
                    v,
                )
                .map_err(bad)?;
            }
            continue;
        }
        if matches!(key.as_str(), "runtime" | "server") && value.is_table() {
            return Err(bad(format!(
                "[{key}]: {name} takes no [{key}] table (its rrpc settings come from its own \
                 flags; [runtime] and [server] are for the service binaries' --config and \
                 topology files)"
            )));
        }
        let long = key.replace('_', "-");
        if long == "config" {
            return Err(bad(
                "a config file cannot name another (`config` key)".into()
            ));
        }
        if !has_flag(&long) {
            return Err(bad(format!(
                "`{key}`: {name} has no --{long} flag (the file's keys are its long flags)"
            )));
        }
        push_flag(
            &mut flags,
            &format!("--{long}"),
            &format!("`{key}`"),
            &value,
        )
        .map_err(bad)?;
    }
    Ok(flags)
}

/// Append `flag` for `value` to `flags` (see [`config_flags`]); `what` names the key in
/// the error for a value that is a table, an array or a date.
fn push_flag(
    flags: &mut Vec<String>,
    flag: &str,
    what: &str,
    value: &toml::Value,
) -> Result<(), String> {
    match value {
        toml::Value::String(v) => flags.extend([flag.to_string(), v.clone()]),
        toml::Value::Integer(v) => flags.extend([flag.to_string(), v.to_string()]),
        toml::Value::Float(v) => flags.extend([flag.to_string(), v.to_string()]),
        toml::Value::Boolean(true) => flags.push(flag.to_string()),
        toml::Value::Boolean(false) => {}
        other => {
            return Err(format!(
                "{what} is a {}: a flag's value is a string, number or boolean \
                 (a list such as --sweep's is one string: \"theta=0,0.5\")",
                other.type_str()
            ))
        }
    }
    Ok(())
}

/// Parse `argv` (program name first) with `A`'s parser and its binary's `defaults` (see
/// [`crate::cli::try_parse_from`]), after expanding `--config FILE.toml` (an argument
/// with id `config`, when `A` has one) into flags ([`config_flags`]) placed before the
/// command line's own (right after the subcommand's name when there is one, so that the
/// file may hold the subcommand's flags too), so that the command line wins (the command
/// lets a flag override itself).
///
/// Errors: clap's for the command line ([`ConfigError::Clap`]: print with
/// `clap::Error::exit`), the file's ([`ConfigError::Read`], [`ConfigError::File`], also
/// a value from the file that its flag refuses): a usage error, exit code 2.
pub fn parse_with_config<A, I, T>(
    argv: I,
    defaults: &[(&'static str, &'static str)],
) -> Result<A, ConfigError>
where
    A: clap::Parser,
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let argv: Vec<std::ffi::OsString> = argv.into_iter().map(Into::into).collect();
    let cmd = crate::cli::command_with_defaults::<A>(defaults).args_override_self(true);
    let parse = |a: &[std::ffi::OsString]| {
        let mut m = cmd.clone().try_get_matches_from(a)?;
        A::from_arg_matches_mut(&mut m).map_err(|e| e.format(&mut A::command()))
    };
    if !cmd.get_arguments().any(|a| a.get_id() == "config") {
        return parse(&argv).map_err(ConfigError::Clap);
    }
    let m = cmd
        .clone()
        .try_get_matches_from(&argv)
        .map_err(ConfigError::Clap)?;
    let sub = m.subcommand();
    let path = sub
        .map_or(&m, |(_, sm)| sm)
        .try_get_one::<PathBuf>("config")
        .ok()
        .flatten()
        .or_else(|| m.try_get_one::<PathBuf>("config").ok().flatten())
        .cloned();
    let Some(path) = path else {
        return parse(&argv).map_err(ConfigError::Clap);
    };
    // The command (or its subcommand) with the global flags propagated to it.
    let mut built = cmd.clone();
    built.build();
    let program = argv
        .first()
        .map(|a| {
            Path::new(a)
                .file_name()
                .unwrap_or(a.as_ref())
                .to_string_lossy()
                .into_owned()
        })
        .unwrap_or_else(|| built.get_name().to_string());
    let (target, name, at) = match sub {
        Some((s, _)) => {
            let at = argv.iter().position(|a| a == s).map_or(1, |i| i + 1);
            let sub_cmd = built.find_subcommand(s).cloned().unwrap_or(built.clone());
            (sub_cmd, format!("{program} {s}"), at)
        }
        None => (built, program, 1),
    };
    let flags = config_flags(&path, &target, &name)?;
    let mut expanded = argv[..at].to_vec();
    expanded.extend(flags.into_iter().map(Into::into));
    expanded.extend(argv[at..].iter().cloned());
    parse(&expanded).map_err(|e| match e.kind() {
        clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
            ConfigError::Clap(e)
        }
        _ => ConfigError::File {
            path: path.clone(),
            why: e.to_string().trim_end().to_string(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    #[derive(clap::Parser, Debug)]
    #[command(name = "demo")]
    struct Demo {
        #[command(flatten)]
        fabric: crate::cli::FabricArgs,
        #[command(flatten)]
        config: crate::cli::ConfigArg,
        #[arg(long)]
        workload: Option<String>,
        #[arg(long)]
        warehouses: Option<u32>,
        #[arg(long)]
        theta: Option<f64>,
        #[arg(long)]
        no_check: bool,
        #[arg(long)]
        chart: bool,
    }

    fn write(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    fn flags(text: &str) -> Result<Vec<String>, ConfigError> {
        let f = write(text);
        config_flags(f.path(), &Demo::command(), "demo")
    }

    #[test]
    fn keys_become_flags() {
        let f = flags(
            "workload = \"tpcc\"\nwarehouses = 4\ntheta = 0.5\nno_check = true\nchart = false\n\
             [fabric]\nkind = \"shm\"\nmodel = \"none\"\n",
        )
        .unwrap();
        assert_eq!(
            f,
            [
                "--fabric",
                "shm",
                "--model",
                "none",
                "--no-check",
                "--theta",
                "0.5",
                "--warehouses",
                "4",
                "--workload",
                "tpcc"
            ]
        );
        for (bad, want) in [
            ("workload = [1, 2]", "`workload` is a array"),
            (
                "[fabric]\nx = 1",
                "[fabric]: `x`: demo has no such fabric setting",
            ),
            ("[fabric]\nfabric = \"shm\"", "[fabric]: `fabric`"),
            ("[fabric]\nmodel = [1]", "[fabric]: `model` is a array"),
            (
                "[runtime]\ncall-timeout-ms = 5",
                "[runtime]: demo takes no [runtime] table",
            ),
            (
                "[server]\nthreads = 2",
                "[server]: demo takes no [server] table",
            ),
            ("config = \"other.toml\"", "cannot name another"),
            ("no-such = 1", "`no-such`: demo has no --no-such flag"),
            ("= 3", "in "),
        ] {
            let e = flags(bad).unwrap_err();
            assert!(matches!(e, ConfigError::File { .. }), "{bad}: {e}");
            assert!(e.to_string().contains(want), "{bad}: {e}");
        }
        let e =
            config_flags(Path::new("/nonexistent/x.toml"), &Demo::command(), "demo").unwrap_err();
        assert!(e.to_string().contains("/nonexistent/x.toml"), "{e}");
    }

    #[test]
    fn the_command_line_wins_over_the_file() {
        let f = write("warehouses = 4\nworkload = \"tpcc\"\n[fabric]\nmodel = \"none\"\n");
        let p = f.path().to_str().unwrap();
        let d: Demo = parse_with_config(["demo", "--config", p, "--warehouses", "2"], &[]).unwrap();
        assert_eq!(
            (d.warehouses, d.workload.as_deref()),
            (Some(2), Some("tpcc"))
        );
        assert_eq!(d.fabric.model.as_deref(), Some("none"));
        let d: Demo = parse_with_config(["demo", "--config", p, "--model", "cx6"], &[]).unwrap();
        assert_eq!(d.fabric.model.as_deref(), Some("cx6"));
        let f = write("warehouses = \"four\"\n");
        let p = f.path().to_str().unwrap();
        let e = parse_with_config::<Demo, _, _>(["demo", "--config", p], &[]).unwrap_err();
        assert!(matches!(e, ConfigError::File { .. }), "{e}");
        assert!(
            e.to_string().contains(p) && e.to_string().contains("four"),
            "{e}"
        );
        let e = parse_with_config::<Demo, _, _>(["demo", "--bogus"], &[]).unwrap_err();
        assert!(matches!(e, ConfigError::Clap(_)), "{e}");
    }

    #[derive(clap::Parser, Debug)]
    #[command(name = "subs")]
    struct Subs {
        #[command(flatten)]
        fabric: crate::cli::FabricArgs,
        #[command(flatten)]
        config: crate::cli::ConfigArg,
        #[command(subcommand)]
        cmd: Sub,
    }

    #[derive(clap::Subcommand, Debug)]
    enum Sub {
        Run {
            #[arg(long, default_value_t = 1)]
            threads: u32,
        },
    }

    #[test]
    fn a_subcommands_flags_come_from_the_file_too() {
        let f = write("threads = 4\n[fabric]\nmodel = \"none\"\n");
        let p = f.path().to_str().unwrap();
        let s: Subs = parse_with_config(["subs", "run", "--config", p], &[]).unwrap();
        let Sub::Run { threads } = s.cmd;
        assert_eq!((threads, s.fabric.model.as_deref()), (4, Some("none")));
        let s: Subs =
            parse_with_config(["subs", "--config", p, "run", "--threads", "2"], &[]).unwrap();
        let Sub::Run { threads } = s.cmd;
        assert_eq!(threads, 2, "the command line wins");
        let f = write("bogus = 4\n");
        let p = f.path().to_str().unwrap();
        let e = parse_with_config::<Subs, _, _>(["subs", "run", "--config", p], &[]).unwrap_err();
        assert!(
            e.to_string().contains("subs run has no --bogus flag"),
            "{e}"
        );
    }
}
