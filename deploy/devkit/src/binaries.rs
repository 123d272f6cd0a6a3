//! Locating the PostgreSQL server binaries (`initdb`, `pg_ctl`, `postgres`).

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Environment variable naming a directory that holds `initdb`, `pg_ctl` and
/// `postgres`; when set it wins over `PATH` and `/usr/lib/postgresql`.
pub const PG_BIN_DIR_ENV: &str = "GANGWAY_PG_BIN_DIR";

/// Where Debian/Ubuntu install the server binaries: `/usr/lib/postgresql/<major>/bin`.
pub const DEBIAN_PG_LIB_ROOT: &str = "/usr/lib/postgresql";

/// How to get the binaries, quoted in the error when they are missing.
pub const INSTALL_HINT: &str =
    "install them with `apt-get update && apt-get install -y postgresql` \
(Debian package; PostgreSQL 15 on bookworm), or put a directory holding initdb, pg_ctl and \
postgres on PATH (or name it in GANGWAY_PG_BIN_DIR)";

const REQUIRED: [&str; 3] = ["initdb", "pg_ctl", "postgres"];

/// The three server binaries, all from one directory (so their versions match).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgBinaries {
    pub bin_dir: PathBuf,
    pub initdb: PathBuf,
    pub pg_ctl: PathBuf,
    pub postgres: PathBuf,
}

impl PgBinaries {
    /// `$GANGWAY_PG_BIN_DIR`, else the first `PATH` entry holding all three
    /// binaries, else the newest `/usr/lib/postgresql/*/bin`.
    pub fn find() -> Result<Self> {
        if let Some(dir) = std::env::var_os(PG_BIN_DIR_ENV).filter(|d| !d.is_empty()) {
            return Self::from_dir(Path::new(&dir))
                .with_context(|| format!("{PG_BIN_DIR_ENV}={}", Path::new(&dir).display()));
        }
        Self::find_in(
            std::env::var_os("PATH").as_deref(),
            Path::new(DEBIAN_PG_LIB_ROOT),
        )
    }

    /// [`find`](Self::find) with an explicit `PATH` value and library root.
    pub fn find_in(path_var: Option<&OsStr>, lib_root: &Path) -> Result<Self> {
        if let Some(path_var) = path_var {
            for dir in std::env::split_paths(path_var) {
                if dir.as_os_str().is_empty() {
                    continue;
                }
                if let Ok(found) = Self::from_dir(&dir) {
                    return Ok(found.resolved());
                }
            }
        }
        let mut versioned: Vec<(Vec<u64>, PathBuf)> = Vec::new();
        if let Ok(entries) = std::fs::read_dir(lib_root) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let key: Vec<u64> = name.split('.').map_while(|p| p.parse().ok()).collect();
                if key.is_empty() {
                    continue;
                }
                versioned.push((key, entry.path().join("bin")));
            }
        }
        versioned.sort();
        for (_, dir) in versioned.iter().rev() {
            if let Ok(found) = Self::from_dir(dir) {
                return Ok(found);
            }
        }
        bail!(
            "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH or under \
             {}/*/bin: {INSTALL_HINT}",
            lib_root.display()
        )
    }

    /// The installation behind links: a `PATH` directory of links to the
    /// server's binaries (`/usr/local/bin/postgres` →
    /// `/usr/lib/postgresql/15/bin/postgres`) is replaced by the directory
    /// they point into when it holds all three, so that the installation's
    /// other programs (pg_basebackup, pg_rewind, which Patroni needs) sit
    /// next to them.
    fn resolved(self) -> Self {
        let real = std::fs::canonicalize(&self.postgres).ok();
        match real.as_deref().and_then(Path::parent) {
            Some(dir) if dir != self.bin_dir => Self::from_dir(dir).unwrap_or(self),
            _ => self,
        }
    }

    /// The binaries in `dir`; an error names the missing ones.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let missing: Vec<&str> = REQUIRED
            .iter()
            .copied()
            .filter(|name| !is_executable(&dir.join(name)))
            .collect();
        if !missing.is_empty() {
            bail!(
                "{} has no executable {}: {INSTALL_HINT}",
                dir.display(),
                missing.join(", ")
            );
        }
        Ok(Self {
            bin_dir: dir.to_path_buf(),
            initdb: dir.join("initdb"),
            pg_ctl: dir.join("pg_ctl"),
            postgres: dir.join("postgres"),
        })
    }

    /// Major version of the server (`15` for 15.x), from `postgres --version`.
    pub fn major_version(&self) -> Result<u32> {
        let out = Command::new(&self.postgres)
            .arg("--version")
            .output()
            .with_context(|| format!("running {} --version", self.postgres.display()))?;
        let text = String::from_utf8_lossy(&out.stdout);
        parse_major_version(&text).with_context(|| {
            format!(
                "cannot read the version from `{} --version` output {text:?}",
                self.postgres.display()
            )
        })
    }
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// `postgres (PostgreSQL) 15.10 (Debian 15.10-0+deb12u1)` -> 15.
fn parse_major_version(text: &str) -> Option<u32> {
    let rest = text.split("(PostgreSQL)").nth(1)?.trim_start();
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_versions() {
        assert_eq!(
            parse_major_version("postgres (PostgreSQL) 15.10 (Debian 15.10-0+deb12u1)\n"),
            Some(15)
        );
        assert_eq!(parse_major_version("postgres (PostgreSQL) 9.6.24"), Some(9));
        assert_eq!(parse_major_version("garbage"), None);
    }

    #[test]
    fn missing_binaries_say_how_to_install() {
        let empty = tempfile::tempdir().unwrap();
        let err = PgBinaries::find_in(Some(empty.path().as_os_str()), &empty.path().join("none"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("apt-get update && apt-get install -y postgresql"),
            "{err}"
        );
        assert!(err.contains("PATH"), "{err}");
    }

    #[test]
    fn picks_newest_versioned_dir() {
        let root = tempfile::tempdir().unwrap();
        for v in ["9.6", "13", "15", "notaversion"] {
            let bin = root.path().join(v).join("bin");
            std::fs::create_dir_all(&bin).unwrap();
            for name in REQUIRED {
                let p = bin.join(name);
                std::fs::write(&p, "#!/bin/sh\n").unwrap();
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
        }
        let found = PgBinaries::find_in(None, root.path()).unwrap();
        assert_eq!(found.bin_dir, root.path().join("15").join("bin"));
    }
}
