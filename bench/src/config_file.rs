//! `--config FILE.toml` for the benchmark binaries: a file whose keys are the command's
//! long flags (kebab-case, or snake_case, which is read as kebab-case), and a `[fabric]`
//! table (`kind`, `model`: the shared fabric flags), turned into flags that go before
//! the command line's own, so that the command line wins (the command lets a flag
//! override itself: clap's `args_override_self`), and `[runtime]` and `[server]` tables
//! (rrpc's `RuntimeConfig` and `ServerConfig` keys, read by [`rpc_settings_in`]). The
//! service binaries' files have the same shape (`rrpc::settings_file`).

use std::path::{Path, PathBuf};

use rrpc::node::RpcSettings;

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
/// or `[server]` table with an unknown key or a bad value (those tables are not flags:
/// they are checked here and read by [`rpc_settings_in`]).
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
    rpc_settings_of(path, &table, RpcSettings::default())?;
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
            continue;
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

/// `base` with the `[runtime]` and `[server]` tables of the `--config` file `path` over
/// it (rrpc's `RuntimeConfig` and `ServerConfig` keys, kebab-case, as in a topology file
/// or a service's settings file); `base` itself when the file has neither. The benchmark
/// binaries build their runtime contexts and RPC servers from these (a binary's own
/// flags win where it has them: a server core, a Rocket geometry a sweep sets per point).
///
/// Errors: the file cannot be read or is not TOML; either table holds an unknown key or
/// a value of a wrong type, or the settings do not validate (naming the file, the table
/// and the key).
pub fn rpc_settings_in(path: &Path, base: RpcSettings) -> Result<RpcSettings, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let table: toml::Table = toml::from_str(&text).map_err(|e| ConfigError::File {
        path: path.to_path_buf(),
        why: e.to_string(),
    })?;
    rpc_settings_of(path, &table, base)
}

/// [`rpc_settings_in`] of the parsed file `table`.
fn rpc_settings_of(
    path: &Path,
    table: &toml::Table,
    base: RpcSettings,
) -> Result<RpcSettings, ConfigError> {
    let of = |name: &str| match table.get(name) {
        Some(toml::Value::Table(t)) => t.clone(),
        _ => toml::Table::new(),
    };
    let file = rrpc::settings_file::SettingsFile {
        path: path.to_path_buf(),
        runtime: of("runtime"),
        server: of("server"),
        ..Default::default()
    };
    file.rpc_settings_over(base).map_err(|e| match e {
        rrpc::settings_file::SettingsError::Invalid { table, why, .. } => ConfigError::File {
            path: path.to_path_buf(),
            why: format!("{table}{why}"),
        },
        other => ConfigError::File {
            path: path.to_path_buf(),
            why: other.to_string(),
        },
    })
}

/// The rrpc settings a benchmark reads from its `--config` file (an inherent method of
/// [`crate::cli::ConfigArg`], here beside the file's other readers).
impl crate::cli::ConfigArg {
    /// The rrpc settings of the benchmark's runtime contexts and servers: the file's
    /// `[runtime]` and `[server]` over the defaults (the defaults without a file). The
    /// binary's own flags win where it has them (a server core, a sweep's Rocket).
    ///
    /// Errors: the file cannot be read, or a table does not parse or validate (parsing
    /// the command line checked them already, so only a file changed since fails here).
    pub fn rpc_settings(&self) -> Result<RpcSettings, ConfigError> {
        match &self.config {
            Some(p) => rpc_settings_in(p, RpcSettings::default()),
            None => Ok(RpcSettings::default()),
        }
    }
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
            ("[runtime]\nbogus = 5", "[runtime]: unknown field `bogus`"),
            ("[server]\nmax-ring-bytes = \"x\"", "[server]: "),
            ("[runtime]\nsq-depth = 0", "[runtime]: "),
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

    /// `[runtime]` and `[server]` are no flags: they are read by `rpc_settings_in`, over
    /// the base it is given; a file without them gives the base back.
    #[test]
    fn runtime_and_server_tables_are_the_rpc_settings() {
        let text =
            "theta = 0.5\n[runtime]\ncall-timeout-ms = 1234\n[server]\nmax-ring-bytes = 65536\n";
        assert_eq!(flags(text).unwrap(), ["--theta", "0.5"]);
        let f = write(text);
        let s = rpc_settings_in(f.path(), RpcSettings::default()).unwrap();
        assert_eq!(
            s.runtime.call_timeout,
            std::time::Duration::from_millis(1234)
        );
        assert_eq!(s.server.max_ring_bytes, 65536);
        let base = RpcSettings::default();
        assert_ne!(base.server.max_ring_bytes, 65536);
        // Over a base: the file's keys win, the base's others stay.
        let mut over = RpcSettings::default();
        over.runtime.sq_depth = 77;
        over.server.max_ring_bytes = 1 << 20;
        let s = rpc_settings_in(f.path(), over).unwrap();
        assert_eq!(s.runtime.sq_depth, 77);
        assert_eq!(s.server.max_ring_bytes, 65536);
        let plain = write("theta = 0.5\n");
        assert_eq!(rpc_settings_in(plain.path(), base.clone()).unwrap(), base);
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
