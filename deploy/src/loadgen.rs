//! `gangway loadgen`: a load generator for `POST /v1/jobs`, run as its own
//! process against the global tier (or anything serving the public API).
//!
//! Closed loop by default (`--concurrency` workers, each sending its next
//! request when the previous one answered); `--rate` makes it an open loop
//! that sends at a fixed rate whatever the latency, and measures each
//! latency from the request's scheduled send time, so a slow server cannot
//! hide its queueing (no coordinated omission).
//!
//! Every request carries a unique `Idempotency-Key`. Latencies are kept as
//! microseconds in a `Vec<u32>` and sorted once at the end: exact
//! percentiles, 4 bytes a request.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use reqwest::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use serde::Serialize;
use tokio::sync::Semaphore;

use crate::conn::Conn;

#[derive(Args, Debug)]
pub struct LoadgenArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Closed loop: this many requests in flight at all times. With
    /// `--rate`: the most requests in flight (default 1024).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Open loop: send this many requests per second, whatever the latency.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Stop sending after this many seconds (default 10 unless `--requests`).
    #[arg(long)]
    pub duration_s: Option<f64>,
    /// Stop after this many requests (the warm-up's included).
    #[arg(long)]
    pub requests: Option<u64>,
    /// Requests that start in the first this-many seconds are sent but not
    /// counted (connection set-up, caches).
    #[arg(long, default_value_t = 0.0)]
    pub warmup_s: f64,
    /// GPUs of each submitted job.
    #[arg(long, default_value_t = 1)]
    pub gpus: i64,
    /// GPU type of each submitted job.
    #[arg(long, default_value = "h100")]
    pub gpu_type: String,
    /// The jobs' estimated run time (the sim executor runs this × its
    /// time factor).
    #[arg(long, default_value_t = 1)]
    pub estimated_duration_s: i64,
    /// Spread requests round-robin over several tenants: names of
    /// environment variables holding their tokens (looked up in the
    /// environment, then in the state dir's `env`), e.g.
    /// `GANGWAY_TOKEN,GANGWAY_TOKEN_GLOBEX`.
    #[arg(long, value_delimiter = ',')]
    pub tenants: Vec<String>,
    /// Extra API base URLs (other global replicas); requests are spread
    /// round-robin over `--url` and these.
    #[arg(long = "also-url", value_delimiter = ',')]
    pub also_urls: Vec<String>,
    /// Seconds to wait for any one answer.
    #[arg(long, default_value_t = 30)]
    pub timeout_s: u64,
    /// A mix of job sizes instead of `--gpus`: powers of two from 1 to
    /// this many GPUs, a size of `g` GPUs drawn with weight 1/√g (so most
    /// jobs are small and a few span racks). Jobs over 8 GPUs run 8 GPUs a
    /// worker, as gangs.
    #[arg(long)]
    pub mix_max_gpus: Option<i64>,
    /// With `--mix-max-gpus`: each job's estimated run time drawn evenly
    /// from `MIN-MAX` seconds (the sim executor runs it × its time factor).
    #[arg(long, value_parser = parse_range)]
    pub mix_duration_s: Option<(i64, i64)>,
    /// Send a request answered with `Retry-After` (429 rate_limited, 503
    /// overloaded) again after that many seconds, with the same key, up
    /// to this many times (0: count the answer as it is). Latency then
    /// includes the waits.
    #[arg(long, default_value_t = 0)]
    pub retry_after: u32,
}

fn parse_range(s: &str) -> Result<(i64, i64), String> {
    let (a, b) = s.split_once('-').ok_or("expected MIN-MAX")?;
    let (a, b): (i64, i64) = (
        a.trim().parse().map_err(|e| format!("{e}"))?,
        b.trim().parse().map_err(|e| format!("{e}"))?,
    );
    if a < 1 || b < a {
        return Err("expected 1 <= MIN <= MAX".into());
    }
    Ok((a, b))
}

/// How many different bodies a mix cycles through.
const MIX_BODIES: usize = 4096;

/// The request bodies: one, or a mix of sizes and run times drawn from a
/// fixed seed (so two runs send the same jobs). Leaked once, so each
/// request borrows one without a copy.
fn bodies(args: &LoadgenArgs) -> Vec<&'static [u8]> {
    let body = |gpus: i64, secs: i64| -> &'static [u8] {
        let mut spec = serde_json::json!({
            "name": "loadgen",
            "gpus": gpus,
            "gpu_type": args.gpu_type,
            "estimated_duration_s": secs,
            "command": ["sh", "-c", "true"],
        });
        if gpus > 8 {
            spec["gpus_per_worker"] = serde_json::json!(8);
        }
        let bytes = serde_json::to_vec(&spec).expect("a JSON value serializes");
        Box::leak(bytes.into_boxed_slice())
    };
    let Some(max) = args.mix_max_gpus else {
        return vec![body(args.gpus, args.estimated_duration_s)];
    };
    let sizes: Vec<i64> = (0..63)
        .map(|k| 1i64 << k)
        .take_while(|g| *g <= max.max(1))
        .collect();
    let weights: Vec<f64> = sizes.iter().map(|&g| 1.0 / (g as f64).sqrt()).collect();
    let total: f64 = weights.iter().sum();
    let (lo, hi) = args
        .mix_duration_s
        .unwrap_or((args.estimated_duration_s, args.estimated_duration_s));
    // A small xorshift generator: reproducible, no crate for a few lines.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..MIX_BODIES)
        .map(|_| {
            let mut r = next() * total;
            let mut gpus = sizes[sizes.len() - 1];
            for (g, w) in sizes.iter().zip(&weights) {
                if r < *w {
                    gpus = *g;
                    break;
                }
                r -= w;
            }
            let secs = lo + ((next() * (hi - lo + 1) as f64) as i64).min(hi - lo);
            body(gpus, secs)
        })
        .collect()
}

/// Where and as whom to send.
struct Target {
    urls: Vec<String>,
    /// `Authorization` values, one per tenant.
    auths: Vec<HeaderValue>,
    http: reqwest::Client,
    /// Retry a request answered with `Retry-After` (429, 503) this many
    /// times, with the same key, after the seconds it says.
    retries: u32,
    /// Retries made.
    retried: AtomicU64,
}

fn resolve(args: &LoadgenArgs, pool: usize) -> anyhow::Result<Target> {
    let conn = &args.conn;
    let file = crate::conn::state_env(&conn.state_dir);
    let url = conn
        .url
        .clone()
        .or_else(|| file.get("GANGWAY_URL").cloned())
        .context(
            "no API URL: pass --url, set GANGWAY_URL, or pass --state-dir of `gangway dev up`",
        )?;
    let mut urls = vec![url];
    urls.extend(args.also_urls.iter().cloned());
    let urls: Vec<String> = urls
        .into_iter()
        .map(|u| format!("{}/v1/jobs", u.trim_end_matches('/')))
        .collect();
    let tokens: Vec<String> = if args.tenants.is_empty() {
        vec![conn
            .token
            .clone()
            .or_else(|| file.get("GANGWAY_TOKEN").cloned())
            .context("no token: set GANGWAY_TOKEN, pass --token or --state-dir")?]
    } else {
        args.tenants
            .iter()
            .map(|var| {
                std::env::var(var)
                    .ok()
                    .or_else(|| file.get(var).cloned())
                    .with_context(|| {
                        format!("--tenants: {var} is neither in the environment nor in the state dir's env")
                    })
            })
            .collect::<anyhow::Result<_>>()?
    };
    let auths = tokens
        .iter()
        .map(|t| {
            HeaderValue::from_str(&format!("Bearer {t}")).context("a token is not a valid header")
        })
        .collect::<anyhow::Result<_>>()?;
    let ca_path = conn
        .ca_cert
        .clone()
        .or_else(|| file.get("GANGWAY_CA_CERT").map(PathBuf::from));
    let mut builder = reqwest::Client::builder()
        .timeout(Duration::from_secs(args.timeout_s))
        .pool_max_idle_per_host(pool)
        .pool_idle_timeout(Duration::from_secs(90))
        .tcp_nodelay(true);
    if let Some(path) = ca_path {
        let pem = std::fs::read(&path)
            .with_context(|| format!("cannot read the CA certificate {}", path.display()))?;
        let cert =
            reqwest::Certificate::from_pem(&pem).context("the CA certificate is not valid PEM")?;
        builder = builder.add_root_certificate(cert);
    }
    Ok(Target {
        urls,
        auths,
        http: builder.build().context("cannot build the HTTP client")?,
        retries: args.retry_after,
        retried: AtomicU64::new(0),
    })
}

/// How one request ended.
enum Outcome {
    Ok {
        region: Option<String>,
    },
    /// `"STATUS code"`, `"STATUS"` or `"transport: …"`.
    Err(String),
}

#[derive(serde::Deserialize)]
struct Created {
    region: Option<String>,
}

#[derive(serde::Deserialize)]
struct ErrBody {
    code: Option<String>,
}

async fn send_one(target: &Target, seq: u64, run: &str, body: &'static [u8]) -> Outcome {
    let url = &target.urls[(seq as usize) % target.urls.len()];
    let auth = &target.auths[(seq as usize / target.urls.len()) % target.auths.len()];
    let mut attempt = 0;
    let resp = loop {
        let req = target
            .http
            .post(url)
            .header(AUTHORIZATION, auth.clone())
            .header(CONTENT_TYPE, "application/json")
            .header("idempotency-key", format!("lg-{run}-{seq}"))
            .body(body);
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => return Outcome::Err(transport(&e)),
        };
        // As a well-behaved client: wait what Retry-After says, then send
        // the same request (same key) again.
        let wait = (resp.headers().get(reqwest::header::RETRY_AFTER))
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        match wait {
            Some(secs) if attempt < target.retries => {
                attempt += 1;
                target.retried.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_secs(secs.min(30))).await;
            }
            _ => break resp,
        }
    };
    let status = resp.status();
    let bytes = match resp.bytes().await {
        Ok(b) => b,
        Err(e) => return Outcome::Err(transport(&e)),
    };
    if status.is_success() {
        let region = serde_json::from_slice::<Created>(&bytes)
            .ok()
            .and_then(|c| c.region);
        Outcome::Ok { region }
    } else {
        match serde_json::from_slice::<ErrBody>(&bytes)
            .ok()
            .and_then(|b| b.code)
        {
            Some(code) => Outcome::Err(format!("{} {code}", status.as_u16())),
            None => Outcome::Err(status.as_u16().to_string()),
        }
    }
}

fn transport(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect"
    } else if e.is_body() || e.is_decode() {
        "body"
    } else {
        "request"
    };
    format!("transport: {kind}")
}

#[derive(Default)]
struct Stats {
    ok_us: Vec<u32>,
    all_us: Vec<u32>,
    errors: BTreeMap<String, u64>,
    regions: BTreeMap<String, u64>,
    /// When the last counted request answered.
    last_done: Option<Instant>,
}

struct Shared {
    stats: Mutex<Stats>,
    /// Requests answered (counted or not), for progress.
    done: AtomicU64,
    errors: AtomicU64,
    measure_from: Instant,
}

impl Shared {
    fn record(&self, scheduled: Instant, outcome: Outcome) {
        let now = Instant::now();
        self.done.fetch_add(1, Ordering::Relaxed);
        if matches!(outcome, Outcome::Err(_)) {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        if scheduled < self.measure_from {
            return;
        }
        let us = u32::try_from(now.duration_since(scheduled).as_micros()).unwrap_or(u32::MAX);
        let mut s = self.stats.lock().expect("stats lock");
        s.all_us.push(us);
        s.last_done = Some(now);
        match outcome {
            Outcome::Ok { region } => {
                s.ok_us.push(us);
                *s.regions
                    .entry(region.unwrap_or_else(|| "?".into()))
                    .or_default() += 1;
            }
            Outcome::Err(key) => *s.errors.entry(key).or_default() += 1,
        }
    }
}

#[derive(Serialize)]
struct Latency {
    p50_ms: f64,
    p90_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
    max_ms: f64,
    mean_ms: f64,
}

fn latency(sorted_us: &[u32]) -> Option<Latency> {
    if sorted_us.is_empty() {
        return None;
    }
    // Nearest rank: the smallest value with at least q of the samples at or below it.
    let q = |q: f64| {
        let rank = ((q * sorted_us.len() as f64).ceil() as usize).clamp(1, sorted_us.len());
        f64::from(sorted_us[rank - 1]) / 1000.0
    };
    let sum: u64 = sorted_us.iter().map(|&u| u64::from(u)).sum();
    Some(Latency {
        p50_ms: q(0.50),
        p90_ms: q(0.90),
        p99_ms: q(0.99),
        p999_ms: q(0.999),
        max_ms: f64::from(*sorted_us.last().expect("not empty")) / 1000.0,
        mean_ms: sum as f64 / sorted_us.len() as f64 / 1000.0,
    })
}

#[derive(Serialize)]
struct Report {
    mode: String,
    concurrency: usize,
    target_rate: Option<f64>,
    urls: Vec<String>,
    tenants: usize,
    gpus: i64,
    gpu_type: String,
    warmup_s: f64,
    /// Seconds from the end of the warm-up to the last counted answer.
    measured_s: f64,
    requests: u64,
    ok: u64,
    errors: BTreeMap<String, u64>,
    /// Successful submissions per second.
    throughput_per_s: f64,
    /// Latency of the successful submissions.
    latency_ok: Option<Latency>,
    /// Latency of every counted request, errors included.
    latency_all: Option<Latency>,
    /// Where the global tier put the jobs.
    regions: BTreeMap<String, u64>,
    /// CPU seconds this process used (it shares the machine with the server).
    loadgen_cpu_s: f64,
    /// Requests sent again after a `Retry-After` (`--retry-after`).
    retried: u64,
}

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return f64::NAN;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

pub async fn run(args: LoadgenArgs) -> anyhow::Result<u8> {
    if let Some(r) = args.rate {
        if !(r > 0.0 && r.is_finite()) {
            bail!("--rate must be a positive number of requests per second");
        }
    }
    let concurrency = args
        .concurrency
        .unwrap_or(if args.rate.is_some() { 1024 } else { 32 });
    if concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    let duration = match (args.duration_s, args.requests) {
        (Some(d), _) => Some(Duration::from_secs_f64(d)),
        (None, Some(_)) => None,
        (None, None) => Some(Duration::from_secs(10)),
    };
    let target = Arc::new(resolve(&args, concurrency)?);
    let bodies: Arc<[&'static [u8]]> = bodies(&args).into();
    // A run id keeps keys unique across runs against the same cloud.
    let run_id: Arc<str> = uuid::Uuid::new_v4().simple().to_string()[..12].into();

    let start = Instant::now();
    let warmup = Duration::from_secs_f64(args.warmup_s.max(0.0));
    let shared = Arc::new(Shared {
        stats: Mutex::new(Stats::default()),
        done: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        measure_from: start + warmup,
    });
    let deadline = duration.map(|d| start + warmup + d);
    // `--requests` counts every request, the warm-up's included.
    let limit = args.requests;
    let issued = Arc::new(AtomicU64::new(0));
    let cpu_before = cpu_seconds();

    let progress = {
        let shared = shared.clone();
        let issued = issued.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            let mut last = 0u64;
            loop {
                tick.tick().await;
                let done = shared.done.load(Ordering::Relaxed);
                let errors = shared.errors.load(Ordering::Relaxed);
                let sent = issued.load(Ordering::Relaxed);
                let t = start.elapsed().as_secs_f64();
                eprintln!(
                    "{t:6.1}s  answered {done:>8}  errors {errors:>6}  in flight {:>5}  {:>6} req/s in the last second  {:>7.0} req/s overall",
                    sent.saturating_sub(done),
                    done - last,
                    done as f64 / t,
                );
                last = done;
            }
        })
    };

    let mode = if args.rate.is_some() {
        "open"
    } else {
        "closed"
    };
    match args.rate {
        None => {
            let mut workers = Vec::with_capacity(concurrency);
            for _ in 0..concurrency {
                let (target, shared, issued, run_id, bodies) = (
                    target.clone(),
                    shared.clone(),
                    issued.clone(),
                    run_id.clone(),
                    bodies.clone(),
                );
                workers.push(tokio::spawn(async move {
                    loop {
                        if deadline.is_some_and(|d| Instant::now() >= d) {
                            break;
                        }
                        let seq = issued.fetch_add(1, Ordering::Relaxed);
                        if limit.is_some_and(|n| seq >= n) {
                            issued.fetch_sub(1, Ordering::Relaxed);
                            break;
                        }
                        let sent = Instant::now();
                        let body = bodies[seq as usize % bodies.len()];
                        let outcome = send_one(&target, seq, &run_id, body).await;
                        shared.record(sent, outcome);
                    }
                }));
            }
            for w in workers {
                w.await.context("a load worker panicked")?;
            }
        }
        Some(rate) => {
            let sem = Arc::new(Semaphore::new(concurrency));
            let interval = Duration::from_secs_f64(1.0 / rate);
            let mut tasks = tokio::task::JoinSet::new();
            let mut seq = 0u64;
            loop {
                let scheduled = start + interval.mul_f64(seq as f64);
                if deadline.is_some_and(|d| scheduled >= d) || limit.is_some_and(|n| seq >= n) {
                    break;
                }
                tokio::time::sleep_until(scheduled.into()).await;
                let permit = sem.clone().acquire_owned().await.expect("never closed");
                issued.fetch_add(1, Ordering::Relaxed);
                let (target, shared, run_id) = (target.clone(), shared.clone(), run_id.clone());
                let body = bodies[seq as usize % bodies.len()];
                tasks.spawn(async move {
                    let outcome = send_one(&target, seq, &run_id, body).await;
                    shared.record(scheduled, outcome);
                    drop(permit);
                });
                // Reap finished tasks so the set stays small.
                while tasks.try_join_next().is_some() {}
                seq += 1;
            }
            while tasks.join_next().await.is_some() {}
        }
    }
    progress.abort();
    let cpu = cpu_seconds() - cpu_before;

    let mut stats = std::mem::take(&mut *shared.stats.lock().expect("stats lock"));
    stats.ok_us.sort_unstable();
    stats.all_us.sort_unstable();
    let measured = stats
        .last_done
        .map(|t| t.saturating_duration_since(shared.measure_from))
        .unwrap_or_default()
        .as_secs_f64();
    let ok = stats.ok_us.len() as u64;
    let report = Report {
        mode: mode.to_string(),
        concurrency,
        target_rate: args.rate,
        urls: target.urls.clone(),
        tenants: target.auths.len(),
        gpus: args.gpus,
        gpu_type: args.gpu_type.clone(),
        warmup_s: warmup.as_secs_f64(),
        measured_s: measured,
        requests: stats.all_us.len() as u64,
        ok,
        errors: stats.errors,
        throughput_per_s: if measured > 0.0 {
            ok as f64 / measured
        } else {
            0.0
        },
        latency_ok: latency(&stats.ok_us),
        latency_all: latency(&stats.all_us),
        regions: stats.regions,
        loadgen_cpu_s: cpu,
        retried: target.retried.load(Ordering::Relaxed),
    };
    if args.conn.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("a report serializes")
        );
    } else {
        print_table(&report);
    }
    Ok(if report.errors.is_empty() && ok > 0 {
        0
    } else {
        1
    })
}

fn print_table(r: &Report) {
    let row = |k: &str, v: String| println!("{k:<22} {v}");
    row(
        "mode",
        match r.target_rate {
            Some(rate) => format!(
                "open loop at {rate} req/s (at most {} in flight)",
                r.concurrency
            ),
            None => format!("closed loop, concurrency {}", r.concurrency),
        },
    );
    row("target", r.urls.join(", "));
    row("tenants", r.tenants.to_string());
    row("job", format!("{} × {}", r.gpus, r.gpu_type));
    row(
        "measured",
        format!("{:.2} s (after {:.1} s warm-up)", r.measured_s, r.warmup_s),
    );
    row("requests", r.requests.to_string());
    row("ok", r.ok.to_string());
    if r.errors.is_empty() {
        row("errors", "0".into());
    } else {
        for (k, n) in &r.errors {
            row("error", format!("{n:>8}  {k}"));
        }
    }
    row(
        "throughput",
        format!("{:.1} submissions/s", r.throughput_per_s),
    );
    if let Some(l) = &r.latency_ok {
        row(
            "latency (ok)",
            format!(
                "p50 {:.2} ms  p90 {:.2} ms  p99 {:.2} ms  p99.9 {:.2} ms  max {:.2} ms  mean {:.2} ms",
                l.p50_ms, l.p90_ms, l.p99_ms, l.p999_ms, l.max_ms, l.mean_ms
            ),
        );
    }
    if !r.errors.is_empty() {
        if let Some(l) = &r.latency_all {
            row(
                "latency (all)",
                format!(
                    "p50 {:.2} ms  p90 {:.2} ms  p99 {:.2} ms  max {:.2} ms",
                    l.p50_ms, l.p90_ms, l.p99_ms, l.max_ms
                ),
            );
        }
    }
    if !r.regions.is_empty() {
        row(
            "regions",
            r.regions
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect::<Vec<_>>()
                .join(", "),
        );
    }
    row("loadgen CPU", format!("{:.1} s", r.loadgen_cpu_s));
    if r.retried > 0 {
        row("retried", format!("{} (after Retry-After)", r.retried));
    }
}
