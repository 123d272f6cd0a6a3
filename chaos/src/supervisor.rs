//! A local cloud's processes, held so that they can be broken and mended:
//! each region's control plane, PostgreSQL and agent, the global tier's
//! replicas, and the links between them (proxies that can be cut). The
//! drills' own clouds ([`crate::cloud::Cloud`]) and `gangway dev up` both
//! keep theirs in a [`Supervisor`]; `gangway dev up` also lets the drills of
//! another process break and mend its parts, through [`crate::control`].

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gangway_devkit::PgCluster;
use serde::{Deserialize, Serialize};

use crate::procs::{kill_processes_under, Proc, Proxy};

/// How a process is started, and started again after each kill.
#[derive(Clone, Debug)]
pub struct Launch {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub env: Vec<(OsString, OsString)>,
    /// Where its stdout and stderr go (appended to: a restarted process
    /// keeps its history).
    pub log: PathBuf,
    /// Whether it dies with the thread that started it
    /// (`PR_SET_PDEATHSIG`): only for a supervisor whose starting threads
    /// live as long as it does (`gangway dev up`'s runtime workers), so that
    /// its processes go with it even when it is killed.
    pub die_with_parent: bool,
}

impl Launch {
    pub fn new(program: impl Into<PathBuf>, log: impl Into<PathBuf>) -> Launch {
        Launch {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            log: log.into(),
            die_with_parent: false,
        }
    }

    pub fn arg(mut self, a: impl Into<OsString>) -> Launch {
        self.args.push(a.into());
        self
    }

    pub fn args<S: Into<OsString>>(mut self, args: impl IntoIterator<Item = S>) -> Launch {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Launch {
        self.env.push((key.into(), value.into()));
        self
    }

    pub fn spawn(&self) -> anyhow::Result<Proc> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("cannot open log {}", self.log.display()))?;
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        if self.die_with_parent {
            use std::os::unix::process::CommandExt;
            // SAFETY: prctl is async-signal-safe.
            unsafe {
                cmd.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                    Ok(())
                });
            }
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", self.program.display()))?;
        Ok(Proc(child))
    }
}

/// A part of the cloud to break or mend.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "part", rename_all = "kebab-case")]
pub enum Target {
    /// A whole region, as a power cut: its control plane, PostgreSQL and
    /// agent with SIGKILL, and every worker the agent started. Mended, all
    /// three start again (the agent as a freshly booted machine).
    Region { region: String },
    /// The region's control plane (SIGKILL).
    Control { region: String },
    /// The region's PostgreSQL (SIGKILL of the postmaster); mended, it
    /// starts again on its data (crash recovery) and port.
    Database { region: String },
    /// The region's agent (SIGKILL); its workers go on.
    Agent { region: String },
    /// Every link of the region to its peers and from the global tier (it
    /// still reaches its agents, and they it).
    Links { region: String },
    /// Replica `index` of the global tier (SIGKILL).
    Global { index: usize },
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Region { region } => write!(f, "region {region}"),
            Target::Control { region } => write!(f, "{region}'s control plane"),
            Target::Database { region } => write!(f, "{region}'s PostgreSQL"),
            Target::Agent { region } => write!(f, "{region}'s agent"),
            Target::Links { region } => write!(f, "{region}'s links"),
            Target::Global { index } => write!(f, "global replica {index}"),
        }
    }
}

/// A region as its supervisor describes it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RegionInfo {
    pub name: String,
    /// Its API, straight (not through a link's proxy).
    pub url: String,
    /// Its PostgreSQL, as a connection string.
    pub database: String,
    /// Where its checkpoint store keeps its objects (a `file://` store).
    pub store_dir: PathBuf,
    /// Where its agent runs its workers.
    pub agent_dir: PathBuf,
    /// What of it is broken now: `control`, `database`, `agent`, `links`.
    #[serde(default)]
    pub broken: Vec<String>,
}

/// A replica of the global tier.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GlobalInfo {
    pub url: String,
    pub broken: bool,
}

/// A region's parts, handed to [`Supervisor::new`].
pub struct RegionParts {
    pub info: RegionInfo,
    pub control: Launch,
    pub agent: Launch,
    /// Its PostgreSQL, started (`None`: one the supervisor does not break
    /// or mend, a Patroni cluster the drill holds itself).
    pub database: Option<PgCluster>,
}

/// A link: connections from `from` (a region, or `global`) to region `to`
/// go through `proxy`.
pub struct Link {
    pub from: String,
    pub to: String,
    pub proxy: Proxy,
}

/// A process the supervisor starts, and whether it was broken on purpose.
struct Service {
    what: String,
    launch: Launch,
    proc: Option<Proc>,
    broken: bool,
}

impl Service {
    fn new(what: String, launch: Launch) -> Service {
        Service {
            what,
            launch,
            proc: None,
            broken: false,
        }
    }

    fn start(&mut self) -> anyhow::Result<()> {
        if self.proc.is_none() {
            self.proc = Some(self.launch.spawn()?);
        }
        self.broken = false;
        Ok(())
    }

    fn kill(&mut self) {
        self.proc.take(); // SIGKILL, reaped
        self.broken = true;
    }

    /// Whether it exited on its own (not broken on purpose): says how,
    /// with the last lines of its log.
    fn exited(&mut self) -> Option<String> {
        let status = self.proc.as_mut()?.0.try_wait().ok()??;
        self.proc = None;
        let log = &self.launch.log;
        let tail = gangway_devkit::file_tail(log, 5).replace('\n', "\n    ");
        Some(format!(
            "{} exited ({status}); the end of {}:\n    {tail}",
            self.what,
            log.display()
        ))
    }

    /// SIGTERM, then SIGKILL if it has not exited after `grace`.
    fn stop(&mut self, grace: Duration) {
        let Some(mut p) = self.proc.take() else {
            return;
        };
        // SAFETY: kill(2) on our own child, not reaped yet.
        unsafe { libc::kill(p.0.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = p.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        drop(p); // SIGKILL
    }
}

struct Member {
    info: RegionInfo,
    control: Service,
    agent: Service,
    /// `None` while it is being started again.
    pg: Option<PgCluster>,
    pg_broken: bool,
}

pub struct Supervisor {
    regions: Mutex<Vec<Member>>,
    globals: Mutex<Vec<Service>>,
    links: Vec<Link>,
}

impl Supervisor {
    /// Holds `regions` (their databases started, nothing else yet),
    /// `globals` and `links`; [`Supervisor::start_regions`] and
    /// [`Supervisor::start_globals`] start the rest.
    pub fn new(regions: Vec<RegionParts>, globals: Vec<Launch>, links: Vec<Link>) -> Supervisor {
        let regions = (regions.into_iter())
            .map(|r| Member {
                control: Service::new(format!("{}: the control plane", r.info.name), r.control),
                agent: Service::new(format!("{}: the agent", r.info.name), r.agent),
                info: r.info,
                pg: r.database,
                pg_broken: false,
            })
            .collect();
        let globals = (globals.into_iter().enumerate())
            .map(|(i, l)| Service::new(format!("global replica {i}"), l))
            .collect();
        Supervisor {
            regions: Mutex::new(regions),
            globals: Mutex::new(globals),
            links,
        }
    }

    /// Starts every region's control plane and agent.
    pub fn start_regions(&self) -> anyhow::Result<()> {
        for m in self.lock_regions().iter_mut() {
            m.control.start()?;
            m.agent.start()?;
        }
        Ok(())
    }

    /// Starts every replica of the global tier.
    pub fn start_globals(&self) -> anyhow::Result<()> {
        for g in self.lock_globals().iter_mut() {
            g.start()?;
        }
        Ok(())
    }

    fn lock_regions(&self) -> std::sync::MutexGuard<'_, Vec<Member>> {
        self.regions.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_globals(&self) -> std::sync::MutexGuard<'_, Vec<Service>> {
        self.globals.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The regions' names, in order.
    pub fn names(&self) -> Vec<String> {
        self.lock_regions()
            .iter()
            .map(|m| m.info.name.clone())
            .collect()
    }

    /// Every region as it stands, with what of it is broken.
    pub fn regions(&self) -> Vec<RegionInfo> {
        let cut = |name: &str| {
            (self.links.iter()).any(|l| (l.from == name || l.to == name) && l.proxy.is_cut())
        };
        (self.lock_regions().iter())
            .map(|m| {
                let mut info = m.info.clone();
                info.broken = [
                    ("control", m.control.broken),
                    ("database", m.pg_broken),
                    ("agent", m.agent.broken),
                    ("links", cut(&m.info.name)),
                ]
                .into_iter()
                .filter(|(_, b)| *b)
                .map(|(w, _)| w.to_string())
                .collect();
                info
            })
            .collect()
    }

    /// Whether each replica of the global tier is broken.
    pub fn globals_broken(&self) -> Vec<bool> {
        self.lock_globals().iter().map(|g| g.broken).collect()
    }

    fn member<'a>(regions: &'a mut [Member], name: &str) -> anyhow::Result<&'a mut Member> {
        match regions.iter_mut().find(|m| m.info.name == name) {
            Some(m) => Ok(m),
            None => bail!("no region {name}"),
        }
    }

    /// Breaks `target` (`broken`) or mends it.
    pub async fn apply(&self, target: &Target, broken: bool) -> anyhow::Result<()> {
        match (target, broken) {
            (Target::Region { region }, true) => {
                let agent_dir = {
                    let mut regions = self.lock_regions();
                    let m = Self::member(&mut regions, region)?;
                    m.control.kill();
                    kill_database(m);
                    m.agent.kill();
                    m.info.agent_dir.clone()
                };
                kill_processes_under(&agent_dir);
            }
            (Target::Region { region }, false) => {
                self.start_database(region).await?;
                let mut regions = self.lock_regions();
                let m = Self::member(&mut regions, region)?;
                m.control.start()?;
                m.agent.start()?;
            }
            (Target::Control { region }, true) => Self::member(&mut self.lock_regions(), region)?
                .control
                .kill(),
            (Target::Control { region }, false) => Self::member(&mut self.lock_regions(), region)?
                .control
                .start()?,
            (Target::Agent { region }, true) => {
                Self::member(&mut self.lock_regions(), region)?.agent.kill()
            }
            (Target::Agent { region }, false) => Self::member(&mut self.lock_regions(), region)?
                .agent
                .start()?,
            (Target::Database { region }, true) => {
                let mut regions = self.lock_regions();
                let m = Self::member(&mut regions, region)?;
                if m.pg.is_none() && !m.pg_broken {
                    anyhow::bail!(
                        "{region}'s database is not a server this cloud holds (a Patroni \
                         cluster): `gangway chaos database-failover` drills its failover"
                    );
                }
                kill_database(m)
            }
            (Target::Database { region }, false) => self.start_database(region).await?,
            (Target::Links { region }, cut) => {
                Self::member(&mut self.lock_regions(), region)?;
                for l in (self.links.iter()).filter(|l| l.from == *region || l.to == *region) {
                    l.proxy.set_cut(cut);
                }
            }
            (Target::Global { index }, broken) => {
                let mut globals = self.lock_globals();
                let n = globals.len();
                let Some(g) = globals.get_mut(*index) else {
                    bail!("no global replica {index} (there are {n})");
                };
                if broken {
                    g.kill();
                } else {
                    g.start()?;
                }
            }
        }
        Ok(())
    }

    /// Starts region `name`'s PostgreSQL again if it was killed.
    async fn start_database(&self, name: &str) -> anyhow::Result<()> {
        let pg = {
            let mut regions = self.lock_regions();
            let m = Self::member(&mut regions, name)?;
            if !m.pg_broken {
                return Ok(());
            }
            m.pg.take()
                .ok_or_else(|| anyhow::anyhow!("{name}'s PostgreSQL is being started already"))?
        };
        let (pg, started) = tokio::task::spawn_blocking(move || {
            let mut pg = pg;
            let started = pg.start();
            (pg, started)
        })
        .await?;
        let mut regions = self.lock_regions();
        let m = Self::member(&mut regions, name)?;
        m.pg = Some(pg);
        m.pg_broken = started.is_err();
        started.with_context(|| format!("{name}'s PostgreSQL did not start again"))
    }

    /// Mends everything broken: databases first, then control planes,
    /// agents, links and the global tier's replicas.
    pub async fn mend_all(&self) -> anyhow::Result<()> {
        let mut first_error = None;
        for name in self.names() {
            if let Err(e) = self.start_database(&name).await {
                first_error.get_or_insert(e);
            }
        }
        for m in self.lock_regions().iter_mut() {
            for s in [&mut m.control, &mut m.agent] {
                if s.broken {
                    if let Err(e) = s.start() {
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        for l in &self.links {
            l.proxy.set_cut(false);
        }
        for g in self.lock_globals().iter_mut().filter(|g| g.broken) {
            if let Err(e) = g.start() {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// The processes that exited on their own since the last call (not
    /// broken on purpose), each in words.
    pub fn exited(&self) -> Vec<String> {
        let mut gone = Vec::new();
        for m in self.lock_regions().iter_mut() {
            gone.extend(m.control.exited());
            gone.extend(m.agent.exited());
        }
        for g in self.lock_globals().iter_mut() {
            gone.extend(g.exited());
        }
        gone
    }

    /// Starts again every process that exited on its own (and is not
    /// broken on purpose); says which, and any that would not start.
    pub fn restart_exited(&self) -> Vec<String> {
        let mut said = Vec::new();
        let mut again = |s: &mut Service| {
            if s.proc.is_none() && !s.broken {
                match s.start() {
                    Ok(()) => said.push(format!("{}: started again", s.what)),
                    Err(e) => said.push(format!("{}: cannot start again: {e:#}", s.what)),
                }
            }
        };
        for m in self.lock_regions().iter_mut() {
            again(&mut m.control);
            again(&mut m.agent);
        }
        for g in self.lock_globals().iter_mut() {
            again(g);
        }
        said
    }

    /// Stops everything, gently: the global tier, then agents (each stops
    /// its workers), control planes, and databases (a clean shutdown).
    /// Errors are printed, not returned: the rest still stops.
    pub fn stop(&self, grace: Duration) {
        for g in self.lock_globals().iter_mut() {
            g.stop(grace);
        }
        let mut regions = self.lock_regions();
        for m in regions.iter_mut() {
            m.agent.stop(grace);
        }
        for m in regions.iter_mut() {
            m.control.stop(grace);
        }
        for m in regions.iter_mut() {
            if let Some(mut pg) = m.pg.take() {
                if let Err(e) = pg.stop() {
                    eprintln!("{}: stopping PostgreSQL: {e:#}", m.info.name);
                }
            }
        }
    }
}

/// Kills the region's PostgreSQL, when it is a server the supervisor
/// holds (a Patroni cluster is not: it stays up).
fn kill_database(m: &mut Member) {
    let Some(pg) = m.pg.as_ref() else {
        return;
    };
    if let Some(pid) = pg.postmaster_pid() {
        // SAFETY: signalling a process of ours; its backends exit when
        // they see the postmaster gone.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    m.pg_broken = true;
}

impl Drop for Supervisor {
    /// What is still running is killed, as a test's throwaway cloud wants:
    /// the agents and their workers (in process groups of their own, they
    /// would outlive the agents), the control planes, the global tier, and
    /// the databases (thrown away: killed, not stopped).
    fn drop(&mut self) {
        let mut regions = self.lock_regions();
        for m in regions.iter_mut() {
            m.agent.proc.take();
            kill_processes_under(&m.info.agent_dir);
            m.control.proc.take();
        }
        self.lock_globals().clear();
        for m in regions.iter_mut() {
            if let Some(pg) = m.pg.take() {
                pg.kill_for_exit(Duration::from_secs(5));
            }
        }
    }
}
