//! `--config FILE.toml` for the benchmark binaries: a file whose keys are the command's
//! long flags (kebab-case, or snake_case, which is read as kebab-case), turned into
//! flags that go before the command line's own, so that the command line wins (the
//! command must let a flag override itself: clap's `args_override_self`).

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

/// The flags `path` stands for: `key = "v"` / `key = 3` / `key = 0.5` as `--key v`,
/// `key = true` as `--key` (a switch), `key = false` as nothing. Errors: an unreadable
/// or malformed file, a value that is a table, an array or a date, a `config` key.
pub fn config_flags(path: &Path) -> Result<Vec<String>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let bad = |why: String| ConfigError::File {
        path: path.to_path_buf(),
        why,
    };
    let table: toml::Table = toml::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let mut flags = Vec::new();
    for (key, value) in table {
        let flag = format!("--{}", key.replace('_', "-"));
        if flag == "--config" {
            return Err(bad(
                "a config file cannot name another (`config` key)".into()
            ));
        }
        match value {
            toml::Value::String(v) => flags.extend([flag, v]),
            toml::Value::Integer(v) => flags.extend([flag, v.to_string()]),
            toml::Value::Float(v) => flags.extend([flag, v.to_string()]),
            toml::Value::Boolean(true) => flags.push(flag),
            toml::Value::Boolean(false) => {}
            other => {
                return Err(bad(format!(
                    "`{key}` is a {}: a flag's value is a string, number or boolean \
                     (a list such as --sweep's is one string: \"theta=0,0.5\")",
                    other.type_str()
                )))
            }
        }
    }
    Ok(flags)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(text: &str) -> Result<Vec<String>, ConfigError> {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        config_flags(f.path())
    }

    #[test]
    fn keys_become_flags() {
        let f = flags(
            "workload = \"tpcc\"\nwarehouses = 4\ntheta = 0.5\nno_check = true\nchart = false\n",
        )
        .unwrap();
        assert_eq!(
            f,
            [
                "--no-check",
                "--theta",
                "0.5",
                "--warehouses",
                "4",
                "--workload",
                "tpcc"
            ]
        );
        for bad in [
            "sweep = [1, 2]",
            "[fabric]\nx = 1",
            "config = \"other.toml\"",
            "= 3",
        ] {
            let e = flags(bad).unwrap_err();
            assert!(matches!(e, ConfigError::File { .. }), "{bad}: {e}");
        }
        let e = config_flags(Path::new("/nonexistent/x.toml")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/x.toml"), "{e}");
    }
}
