//! `--config FILE` for the server roles (`gangway region`, `gangway global`,
//! `gangway agent`): a TOML file whose keys are the role's long flags
//! without the dashes (`tls-cert = "/etc/gangway/region.pem"`, `peer =
//! ["us-west=https://…"]`). Precedence, lowest first: the file, then the
//! flag's environment variable, then the command line — so a file is
//! the base, and a flag or variable overrides one key of it. The file is
//! read before the command line is parsed, and its keys become arguments
//! the parser checks like typed ones; a key that is no flag of the role,
//! or a value of the wrong kind, stops the start with the file and the key
//! named. deploy/config/ holds a commented reference file for each role.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{ArgAction, Command};

/// The command line as [`expand`] leaves it, and the file with the keys
/// it set.
pub type Expanded = (Vec<OsString>, Option<(PathBuf, Vec<String>)>);

/// The roles that take `--config`.
pub const ROLES: [&str; 3] = ["region", "global", "agent"];

/// The command line with `--config FILE` (or `GANGWAY_CONFIG`) replaced
/// by the file's settings, for `cli` (the whole program's command, made
/// only when a role is named: the subcommands are deferred, and building
/// them all is most of a client command's start-up, issue 23). The
/// settings go right after the role's name, each only when neither the
/// command line nor its environment variable sets it. Also returns the
/// file and the keys it set, to name them if the parser refuses one.
pub fn expand(cli: impl FnOnce() -> Command, args: Vec<OsString>) -> anyhow::Result<Expanded> {
    let Some(role) = args.get(1).and_then(|a| a.to_str()) else {
        return Ok((args, None));
    };
    if !ROLES.contains(&role) {
        return Ok((args, None));
    }
    let role = role.to_string();
    let mut cli = cli();
    cli.build();
    let sub = cli
        .find_subcommand(&role)
        .with_context(|| format!("no role {role}"))?;
    // An operator's subcommand (`gangway region evacuate …`) takes no file.
    let first = args.get(2).and_then(|a| a.to_str());
    if first.is_some_and(|f| sub.find_subcommand(f).is_some()) {
        return Ok((args, None));
    }
    let mut rest: Vec<OsString> = Vec::new();
    let mut file: Option<PathBuf> = None;
    let mut it = args[2..].iter();
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("--config") => {
                let v = it.next().context("--config needs a file")?;
                file = Some(PathBuf::from(v));
            }
            Some(s) if s.starts_with("--config=") => {
                file = Some(PathBuf::from(&s["--config=".len()..]));
            }
            _ => rest.push(a.clone()),
        }
    }
    let file = file.or_else(|| std::env::var_os("GANGWAY_CONFIG").map(PathBuf::from));
    let Some(file) = file else {
        return Ok((args, None));
    };
    let given: Vec<String> = (rest.iter())
        .filter_map(|a| a.to_str())
        .filter_map(|a| a.strip_prefix("--"))
        .map(|a| a.split('=').next().unwrap_or(a).to_string())
        .collect();
    let (settings, keys) = settings(sub, &role, &file, &given)?;
    let mut out = vec![args[0].clone(), args[1].clone()];
    out.extend(settings);
    out.extend(rest);
    Ok((out, Some((file, keys))))
}

/// The arguments `file` stands for, and the keys they came from.
fn settings(
    sub: &Command,
    role: &str,
    file: &Path,
    given: &[String],
) -> anyhow::Result<(Vec<OsString>, Vec<String>)> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read the configuration file {}", file.display()))?;
    let table: toml::Table = text
        .parse()
        .with_context(|| format!("{} is not valid TOML", file.display()))?;
    let mut out = Vec::new();
    let mut keys = Vec::new();
    for (key, value) in &table {
        let at = || format!("{}: key `{key}`", file.display());
        let arg = (sub.get_arguments())
            .find(|a| a.get_long() == Some(key.as_str()) && key != "config")
            .with_context(|| {
                let known: Vec<&str> = (sub.get_arguments())
                    .filter_map(|a| a.get_long())
                    .filter(|l| !matches!(*l, "help" | "config"))
                    .collect();
                format!(
                    "{}: no such setting for `gangway {role}`; the settings are the role's flags without their dashes: {}",
                    at(),
                    known.join(", ")
                )
            })?;
        // The command line, then the environment, win over the file.
        let from_env = (arg.get_env()).is_some_and(|v| std::env::var_os(v).is_some());
        if given.iter().any(|g| g == key) || from_env {
            continue;
        }
        let flag = format!("--{key}");
        let one = |v: &toml::Value| -> anyhow::Result<String> {
            match v {
                toml::Value::String(s) => Ok(s.clone()),
                toml::Value::Integer(i) => Ok(i.to_string()),
                toml::Value::Float(f) => Ok(f.to_string()),
                other => anyhow::bail!(
                    "{}: expected a string or a number, found {}",
                    at(),
                    other.type_str()
                ),
            }
        };
        match (arg.get_action(), value) {
            (ArgAction::SetTrue, toml::Value::Boolean(true)) => out.push(flag.into()),
            (ArgAction::SetTrue, toml::Value::Boolean(false)) => {}
            (ArgAction::SetTrue, other) => {
                anyhow::bail!(
                    "{}: expected true or false, found {}",
                    at(),
                    other.type_str()
                )
            }
            (ArgAction::Append, toml::Value::Array(items)) => {
                for item in items {
                    out.push(format!("{flag}={}", one(item)?).into());
                }
            }
            (ArgAction::Append, v) => out.push(format!("{flag}={}", one(v)?).into()),
            (_, toml::Value::Array(_)) => {
                anyhow::bail!("{}: takes one value, not a list", at())
            }
            (_, v) => out.push(format!("{flag}={}", one(v)?).into()),
        }
        keys.push(key.clone());
    }
    Ok((out, keys))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, Command};

    fn cli() -> Command {
        Command::new("gangway").subcommand(
            Command::new("region")
                .arg(Arg::new("name").long("name").required(true))
                .arg(Arg::new("listen").long("listen").env("TEST_GANGWAY_LISTEN"))
                .arg(
                    Arg::new("insecure-http")
                        .long("insecure-http")
                        .action(ArgAction::SetTrue),
                )
                .arg(Arg::new("peer").long("peer").action(ArgAction::Append)),
        )
    }

    fn expand_with(toml: &str, args: &[&str]) -> anyhow::Result<Vec<String>> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("region.toml");
        std::fs::write(&file, toml).unwrap();
        let mut argv: Vec<OsString> = vec!["gangway".into(), "region".into()];
        argv.extend(args.iter().map(OsString::from));
        argv.push("--config".into());
        argv.push(file.into_os_string());
        let (out, _) = expand(cli, argv)?;
        Ok(out.into_iter().map(|a| a.into_string().unwrap()).collect())
    }

    #[test]
    fn a_file_sets_what_the_command_line_does_not() {
        let out = expand_with(
            "name = \"us-east\"\nlisten = \"0.0.0.0:7001\"\ninsecure-http = true\npeer = [\"a=https://a\", \"b=https://b\"]\n",
            &["--listen", "127.0.0.1:9"],
        )
        .unwrap();
        assert_eq!(
            out,
            [
                "gangway",
                "region",
                "--insecure-http",
                "--name=us-east",
                "--peer=a=https://a",
                "--peer=b=https://b",
                "--listen",
                "127.0.0.1:9"
            ]
        );
        cli().try_get_matches_from(&out).unwrap();
    }

    #[test]
    fn an_unknown_key_or_a_wrong_kind_is_refused_with_the_key_named() {
        let e = expand_with("nmae = \"x\"\n", &[]).unwrap_err().to_string();
        assert!(
            e.contains("key `nmae`") && e.contains("name, listen"),
            "{e}"
        );
        let e = expand_with("name = [\"x\"]\n", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("key `name`") && e.contains("not a list"), "{e}");
        let e = expand_with("insecure-http = \"yes\"\n", &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("key `insecure-http`") && e.contains("true or false"),
            "{e}"
        );
        let e = expand_with("name = \n", &[]).unwrap_err().to_string();
        assert!(e.contains("not valid TOML"), "{e}");
    }

    #[test]
    fn the_reference_files_are_settings_the_roles_take() {
        use clap::{CommandFactory, Parser};
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
        for role in ROLES {
            let file = dir.join(format!("{role}.toml"));
            let mut argv: Vec<OsString> = vec!["gangway".into(), role.into()];
            argv.push(format!("--config={}", file.display()).into());
            if role == "region" {
                // Given in the environment in production (it holds a password).
                argv.push("--database-url=postgres://localhost/gangway".into());
            }
            let (out, from) = expand(crate::Cli::command, argv).unwrap();
            assert!(from.unwrap().1.len() > 5, "{role}: the file set little");
            if let Err(e) = crate::Cli::try_parse_from(&out) {
                panic!("{role}: {e}");
            }
        }
    }
}
