//! The settings file (`--config FILE.toml`) of the service binaries (`lockd`, `tso`,
//! `tso-proxy`, `memnode`): one loader, one file shape.
//!
//! ```toml
//! [fabric]          # the node flags: cluster, kind (--fabric), listen, model,
//!                   # rdma-device, gid-index, rdma-port, tclass, sl
//! [runtime]         # rrpc::runtime::RuntimeConfig keys, over the topology file's
//! [server]          # rrpc::server::ServerConfig keys, over the topology file's
//! threads = 4       # every other key: the binary's own settings (its long flags' names)
//! ```
//!
//! A flag given on the command line (or through its environment variable) always wins
//! over the file. Errors name the file, the table and the key.

use std::path::{Path, PathBuf};

use crate::node::RpcSettings;
use crate::service::NodeArgs;

/// Why a settings file cannot be used. Its message starts with the file's path, then the
/// table (`[fabric]`), then what is wrong (the key, for an unknown key or a bad value).
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The file cannot be read.
    #[error("reading {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not TOML, or a table holds an unknown key or a value of a wrong type.
    #[error("{}: {table}{why}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The table (`[fabric]: `), or empty for the whole file.
        table: String,
        /// What is wrong.
        why: String,
    },
    /// The topology file (`--hosts`) that the settings go over.
    #[error(transparent)]
    Topology(#[from] crate::service::ArgsError),
}

/// The `[fabric]` table: the node flags' settings (a flag given on the command line or
/// through its environment variable wins). The node id is a flag only (`--node`).
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct FabricSettings {
    /// Cluster name (as `--cluster`).
    pub cluster: Option<String>,
    /// Backend, "shm" or "verbs" (as `--fabric`).
    pub kind: Option<String>,
    /// Bootstrap listen address, `IP:PORT` (as `--listen`).
    pub listen: Option<std::net::SocketAddr>,
    /// Timing model of the shm fabric (as `--model`).
    pub model: Option<String>,
    /// RDMA device for verbs (as `--rdma-device`).
    pub rdma_device: Option<String>,
    /// GID index for verbs (as `--gid-index`).
    pub gid_index: Option<u32>,
    /// RDMA port for verbs (as `--rdma-port`).
    pub rdma_port: Option<u8>,
    /// RoCE traffic class for verbs (as `--tclass`).
    pub tclass: Option<u8>,
    /// Service level for verbs, 0 to 15 (as `--sl`).
    pub sl: Option<u8>,
}

impl FabricSettings {
    /// Apply these settings to `args` where `explicit(clap id)` says the flag was not
    /// given (see [`explicit_in`]).
    ///
    /// Errors: a `kind` that is not a fabric, an `sl` above 15 (messages name the key).
    pub fn apply(
        &self,
        args: &mut NodeArgs,
        explicit: &dyn Fn(&str) -> bool,
    ) -> Result<(), String> {
        if let (Some(v), false) = (&self.cluster, explicit("cluster")) {
            args.cluster = v.clone();
        }
        if let (Some(v), false) = (&self.kind, explicit("fabric")) {
            args.fabric = v.parse().map_err(|e| format!("kind: {e}"))?;
        }
        if let (Some(v), false) = (self.listen, explicit("listen")) {
            args.listen = v;
        }
        if let (Some(v), false) = (&self.model, explicit("model")) {
            args.model = v.clone();
        }
        if let (Some(v), false) = (&self.rdma_device, explicit("rdma_device")) {
            args.rdma_device = Some(v.clone());
        }
        if let (Some(v), false) = (self.gid_index, explicit("gid_index")) {
            args.gid_index = Some(v);
        }
        if let (Some(v), false) = (self.rdma_port, explicit("rdma_port")) {
            args.rdma_port = Some(v);
        }
        if let (Some(v), false) = (self.tclass, explicit("tclass")) {
            args.tclass = Some(v);
        }
        if let (Some(v), false) = (self.sl, explicit("sl")) {
            if v > 15 {
                return Err(format!("sl: {v} is not a service level (0 to 15)"));
            }
            args.sl = Some(v);
        }
        Ok(())
    }
}

/// Whether the argument with clap id `id` was given on the command line or through its
/// environment variable in `m` (rather than defaulted or absent).
pub fn explicit_in(m: &clap::ArgMatches, id: &str) -> bool {
    use clap::parser::ValueSource;
    m.try_contains_id(id).unwrap_or(false)
        && matches!(
            m.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        )
}

/// The value of `r`, or (on an error: a bad settings file, found before anything runs)
/// print `<name>: <error chain>` on stderr and exit with code 2, the usage-error code.
pub fn or_exit<T, E: std::fmt::Display>(name: &str, r: Result<T, E>) -> T {
    match r {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{name}: {e:#}");
            std::process::exit(2)
        }
    }
}

/// Whether the argument with clap id `id` of parser `C` was given on this process's
/// command line or through its environment variable (re-parses `std::env::args_os()`;
/// false when that does not parse).
pub fn given_to_process<C: clap::CommandFactory>(id: &str) -> bool {
    C::command()
        .try_get_matches_from(std::env::args_os())
        .is_ok_and(|m| explicit_in(&m, id))
}

/// A loaded settings file: its `[fabric]`, its `[runtime]` and `[server]` (kept as
/// tables, to merge over the topology file's), and the binary's own keys.
#[derive(Debug, Clone, Default)]
pub struct SettingsFile {
    /// The file (empty when there is none).
    pub path: PathBuf,
    /// The `[fabric]` table.
    pub fabric: FabricSettings,
    /// The `[runtime]` table's keys (kebab-case, as a topology file's).
    pub runtime: toml::Table,
    /// The `[server]` table's keys (kebab-case, as a topology file's).
    pub server: toml::Table,
    /// Every other top-level key: the binary's own settings.
    pub own: toml::Table,
}

impl SettingsFile {
    /// Read `path`: `[fabric]` is checked here (unknown keys and wrong types refused),
    /// `[runtime]` and `[server]` too (over the defaults); the rest is returned as
    /// [`SettingsFile::own`] for the binary to check.
    ///
    /// Errors: [`SettingsError`], naming the file, the table and the key.
    pub fn load(path: &Path) -> Result<Self, SettingsError> {
        let text = std::fs::read_to_string(path).map_err(|source| SettingsError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// [`SettingsFile::load`] of `text`, read from `path` (which errors name).
    ///
    /// Errors: [`SettingsError::Invalid`].
    pub fn parse(path: &Path, text: &str) -> Result<Self, SettingsError> {
        let bad = |table: &str, why: String| SettingsError::Invalid {
            path: path.to_path_buf(),
            table: if table.is_empty() {
                String::new()
            } else {
                format!("{table}: ")
            },
            why: why.trim_end().to_string(),
        };
        let mut own: toml::Table = toml::from_str(text).map_err(|e| bad("", e.to_string()))?;
        let mut table = |name: &str| -> Result<toml::Table, SettingsError> {
            match own.remove(name) {
                None => Ok(toml::Table::new()),
                Some(toml::Value::Table(t)) => Ok(t),
                Some(v) => Err(bad(
                    "",
                    format!("`{name}` is a {}, not a table ([{name}])", v.type_str()),
                )),
            }
        };
        let (fabric, runtime, server) = (table("fabric")?, table("runtime")?, table("server")?);
        let fabric = FabricSettings::deserialize_table(fabric).map_err(|e| bad("[fabric]", e))?;
        let file = SettingsFile {
            path: path.to_path_buf(),
            fabric,
            runtime,
            server,
            own,
        };
        // Check [runtime] and [server] now, over the defaults, so that a bad key is
        // reported before anything runs.
        file.rpc_settings_over(RpcSettings::default())?;
        Ok(file)
    }

    /// `base` (the topology file's, or the defaults) with this file's `[runtime]` and
    /// `[server]` keys over it.
    ///
    /// Errors: an unknown key or a bad value in either table, or settings that do not
    /// validate.
    pub fn rpc_settings_over(&self, base: RpcSettings) -> Result<RpcSettings, SettingsError> {
        let bad = |table: &str, why: String| SettingsError::Invalid {
            path: self.path.clone(),
            table: format!("{table}: "),
            why: why.trim_end().to_string(),
        };
        let mut out = base;
        if !self.runtime.is_empty() {
            let mut t =
                toml::Table::try_from(&out.runtime).map_err(|e| bad("[runtime]", e.to_string()))?;
            t.extend(self.runtime.clone());
            out.runtime = t
                .try_into()
                .map_err(|e: toml::de::Error| bad("[runtime]", e.message().to_string()))?;
            out.runtime
                .validate()
                .map_err(|e| bad("[runtime]", e.to_string()))?;
        }
        if !self.server.is_empty() {
            let mut t =
                toml::Table::try_from(&out.server).map_err(|e| bad("[server]", e.to_string()))?;
            t.extend(self.server.clone());
            out.server = t
                .try_into()
                .map_err(|e: toml::de::Error| bad("[server]", e.message().to_string()))?;
            out.server
                .validate()
                .map_err(|e| bad("[server]", e.to_string()))?;
        }
        Ok(out)
    }

    /// The rrpc settings of a process with node flags `args` and this file:
    /// `--rpc-settings` if given (it wins over every file), else the topology file's
    /// (`--hosts`) or the defaults, with this file's `[runtime]` and `[server]` over them.
    ///
    /// Errors: the topology file's; this file's tables' (see
    /// [`SettingsFile::rpc_settings_over`]).
    pub fn rpc_settings(&self, args: &NodeArgs) -> Result<RpcSettings, SettingsError> {
        if let Some(s) = &args.rpc_settings_json {
            return Ok(s.clone());
        }
        let base = args.rpc_settings()?;
        self.rpc_settings_over(base)
    }

    /// Apply `[fabric]` to `args` where `explicit(clap id)` says a flag was not given
    /// (on the command line or through its environment variable: [`explicit_in`],
    /// [`given_to_process`]).
    ///
    /// Errors: a bad value, naming the file, `[fabric]` and the key.
    pub fn apply_fabric(
        &self,
        args: &mut NodeArgs,
        explicit: &dyn Fn(&str) -> bool,
    ) -> Result<(), SettingsError> {
        self.fabric
            .apply(args, explicit)
            .map_err(|why| SettingsError::Invalid {
                path: self.path.clone(),
                table: "[fabric]: ".into(),
                why,
            })
    }
}

impl SettingsFile {
    /// The file as command-line flags of `cmd`, for a binary whose own keys are its long
    /// flags (`memnode`): `[fabric]`'s as the node flags (`kind` as `--fabric`), then
    /// each own key `k = v` as `--k=v` (`k = true` as `--k`, `k = false` as nothing;
    /// snake_case read as kebab-case). Put them before the command line's own flags in a
    /// command that lets a flag override itself, so that the command line wins.
    ///
    /// A flag that `given` (the command line's matches) holds from the command line or
    /// the environment is left out, so that an environment variable (`RRPC_MODEL`) wins
    /// over the file as it does for the other service binaries.
    ///
    /// Errors: a key that is not a long flag of `cmd`, a `config` key, a value that is a
    /// table, an array or a date (naming the file and the key).
    pub fn as_flags(
        &self,
        cmd: &clap::Command,
        given: Option<&clap::ArgMatches>,
    ) -> Result<Vec<std::ffi::OsString>, SettingsError> {
        let bad = |why: String| SettingsError::Invalid {
            path: self.path.clone(),
            table: String::new(),
            why,
        };
        // Whether the flag `--long` was given on the command line or through its
        // environment variable.
        let explicit = |long: &str| {
            given.is_some_and(|m| {
                cmd.get_arguments()
                    .find(|a| a.get_long() == Some(long))
                    .is_some_and(|a| explicit_in(m, a.get_id().as_str()))
            })
        };
        let f = &self.fabric;
        let mut out: Vec<String> = Vec::new();
        let mut put = |long: &str, v: Option<String>| {
            if let (Some(v), false) = (v, explicit(long)) {
                out.push(format!("--{long}={v}"));
            }
        };
        put("cluster", f.cluster.clone());
        put("fabric", f.kind.clone());
        put("listen", f.listen.map(|a| a.to_string()));
        put("model", f.model.clone());
        put("rdma-device", f.rdma_device.clone());
        put("gid-index", f.gid_index.map(|v| v.to_string()));
        put("rdma-port", f.rdma_port.map(|v| v.to_string()));
        put("tclass", f.tclass.map(|v| v.to_string()));
        put("sl", f.sl.map(|v| v.to_string()));
        for (key, value) in &self.own {
            let long = key.replace('_', "-");
            if long == "config" || !cmd.get_arguments().any(|a| a.get_long() == Some(&long)) {
                return Err(bad(format!(
                    "`{key}`: {} has no --{long} flag (the file's keys are its long flags, \
                     besides the [fabric], [runtime] and [server] tables)",
                    cmd.get_name()
                )));
            }
            if explicit(&long) {
                continue;
            }
            match value {
                toml::Value::String(v) => out.push(format!("--{long}={v}")),
                toml::Value::Integer(v) => out.push(format!("--{long}={v}")),
                toml::Value::Float(v) => out.push(format!("--{long}={v}")),
                toml::Value::Boolean(true) => out.push(format!("--{long}")),
                toml::Value::Boolean(false) => {}
                other => {
                    return Err(bad(format!(
                        "`{key}` is a {}: a flag's value is a string, number or boolean",
                        other.type_str()
                    )))
                }
            }
        }
        Ok(out.into_iter().map(Into::into).collect())
    }
}

impl FabricSettings {
    /// Deserialize a `[fabric]` table (errors: the key and what is wrong with it).
    fn deserialize_table(t: toml::Table) -> Result<Self, String> {
        use serde::Deserialize as _;
        FabricSettings::deserialize(t).map_err(|e| e.message().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory as _, FromArgMatches as _};

    #[derive(clap::Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        node: NodeArgs,
    }

    fn parse(text: &str) -> Result<SettingsFile, SettingsError> {
        SettingsFile::parse(Path::new("/etc/x.toml"), text)
    }

    #[test]
    fn tables_apply_and_flags_win() {
        let f = parse(
            "threads = 3\n[fabric]\ncluster = \"c\"\nmodel = \"cx6\"\nlisten = \"127.0.0.1:7000\"\n\
             [runtime]\ncall-timeout-ms = 1234\n",
        )
        .unwrap();
        assert_eq!(f.own.get("threads"), Some(&toml::Value::Integer(3)));
        let m = Cli::command()
            .try_get_matches_from(["x", "--node", "1", "--model", "none"])
            .unwrap();
        let mut node = Cli::from_arg_matches(&m).unwrap().node;
        f.apply_fabric(&mut node, &|id| explicit_in(&m, id))
            .unwrap();
        assert_eq!(node.cluster, "c");
        assert_eq!(node.model, "none", "the flag wins over [fabric] model");
        assert_eq!(node.listen.port(), 7000);
        let s = f.rpc_settings(&node).unwrap();
        assert_eq!(
            s.runtime.call_timeout,
            std::time::Duration::from_millis(1234)
        );
        assert_eq!(s.server, RpcSettings::default().server);
    }

    #[test]
    fn own_keys_and_fabric_as_flags() {
        let f = parse("[fabric]\nkind = \"shm\"\nmodel = \"none\"\n").unwrap();
        let flags = f.as_flags(&Cli::command(), None).unwrap();
        assert_eq!(flags, ["--fabric=shm", "--model=none"]);
        let m = Cli::command()
            .try_get_matches_from(["x", "--node", "1", "--model", "cx6"])
            .unwrap();
        let flags = f.as_flags(&Cli::command(), Some(&m)).unwrap();
        assert_eq!(flags, ["--fabric=shm"], "a flag given is left out");
        let f = parse("exit_on_stdin_eof = true\nadvertise = \"127.0.0.1:1\"\n").unwrap();
        assert_eq!(
            f.as_flags(&Cli::command(), None).unwrap(),
            ["--advertise=127.0.0.1:1", "--exit-on-stdin-eof"]
        );
        for bad in ["no-such-flag = 1\n", "config = \"x\"\n", "cluster = [1]\n"] {
            let e = parse(bad)
                .unwrap()
                .as_flags(&Cli::command(), None)
                .unwrap_err();
            assert!(e.to_string().starts_with("/etc/x.toml: `"), "{bad}: {e}");
        }
    }

    #[test]
    fn errors_name_file_table_and_key() {
        for (text, want) in [
            ("[fabric]\nbogus = 1\n", "[fabric]: unknown field `bogus`"),
            ("[fabric]\ngid-index = \"two\"\n", "[fabric]: invalid type"),
            (
                "[runtime]\nbogus-ms = 1\n",
                "[runtime]: unknown field `bogus-ms`",
            ),
            ("[server]\nbogus = 1\n", "[server]: unknown field `bogus`"),
            ("fabric = 3\n", "`fabric` is a integer"),
            ("= 3\n", "/etc/x.toml: "),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.starts_with("/etc/x.toml: "), "{text}: {e}");
            assert!(e.contains(want), "{text}: {e}");
        }
        let e = SettingsFile::load(Path::new("/nonexistent/y.toml")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/y.toml"), "{e}");
        let f = parse("[fabric]\nkind = \"ib\"\n").unwrap();
        let m = Cli::command()
            .try_get_matches_from(["x", "--node", "1"])
            .unwrap();
        let mut node = Cli::from_arg_matches(&m).unwrap().node;
        let e = f
            .apply_fabric(&mut node, &|id| explicit_in(&m, id))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("/etc/x.toml: [fabric]: kind: "), "{e}");
    }
}
