//! The side-by-side table: one column per policy.

use std::fmt::Write;

use gangway_sched::PolicyKind;

use crate::config::SpareMode;
use crate::metrics::{Metrics, ReservedStats};
use crate::workload::WorkloadSummary;

/// A short column label for a policy.
pub fn policy_label(kind: PolicyKind) -> &'static str {
    match kind {
        PolicyKind::Gangway => "gangway",
        PolicyKind::FifoFirstFit => "fifo-first-fit",
        PolicyKind::SlurmBackfill => "slurm-backfill",
    }
}

/// A duration for people: seconds, minutes, hours or days.
pub fn human_duration(s: f64) -> String {
    match s {
        s if s < 120.0 => format!("{s:.0} s"),
        s if s < 2.0 * 3600.0 => format!("{:.1} min", s / 60.0),
        s if s < 72.0 * 3600.0 => format!("{:.1} h", s / 3600.0),
        s => format!("{:.1} d", s / 86_400.0),
    }
}

fn opt_pct(v: Option<f64>, decimals: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.decimals$} %"))
}

fn thousands(v: u64) -> String {
    let s = v.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The readable table of `results`, one column per policy, after a line
/// saying what was replayed.
pub fn render_table(
    summary: &WorkloadSummary,
    load: f64,
    seed: u64,
    results: &[Metrics],
) -> String {
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    let mut row = |label: &str, f: &dyn Fn(&Metrics) -> String| {
        rows.push((label.to_string(), results.iter().map(f).collect()));
    };
    row("GPU allocation while jobs wait", &|m| {
        opt_pct(m.allocation_while_waiting_pct, 1)
    });
    row("GPU utilization, whole run", &|m| {
        opt_pct(m.utilization_pct, 1)
    });
    row("time with jobs waiting", &|m| {
        human_duration(m.hours_with_waiting_jobs * 3600.0)
    });
    row("stranded GPUs while a gang waits", &|m| {
        opt_pct(m.stranded_while_gang_waits_pct, 2)
    });
    row("free GPUs held for reserved gangs", &|m| {
        opt_pct(m.held_for_reservations_while_waiting_pct, 2)
    });
    row("JCT mean", &|m| human_duration(m.jct_s.mean));
    row("JCT median", &|m| human_duration(m.jct_s.median));
    row("JCT p99", &|m| human_duration(m.jct_s.p99));
    row("queueing delay mean", &|m| {
        human_duration(m.queueing_delay_s.mean)
    });
    row("queueing delay median", &|m| {
        human_duration(m.queueing_delay_s.median)
    });
    row("queueing delay p99", &|m| {
        human_duration(m.queueing_delay_s.p99)
    });
    row("makespan", &|m| human_duration(m.makespan_s as f64));
    row("multi-node gang starts", &|m| {
        thousands(m.gangs.multi_node_starts)
    });
    row("  inside one leaf", &|m| {
        opt_pct(m.gangs.in_one_leaf_pct, 1)
    });
    row("  inside one spine", &|m| {
        opt_pct(m.gangs.in_one_spine_pct, 1)
    });
    row("  in one leaf when a leaf had room", &|m| {
        format!(
            "{} of {}",
            opt_pct(m.gangs.in_one_leaf_when_a_leaf_could_pct, 1),
            thousands(m.gangs.leaf_could_hold)
        )
    });
    row("  spread wider than needed (slowed)", &|m| {
        thousands(m.gangs.spread_starts)
    });
    row("GPU-hours allocated", &|m| format!("{:.0}", m.gpu_hours));
    row("GPU-hours lost to failures", &|m| {
        format!("{:.1}", m.gpu_hours_lost_to_failures)
    });
    row("GPU-hours lost to preemption", &|m| {
        format!("{:.1}", m.gpu_hours_lost_to_preemption)
    });
    row("preemptions (priority / reclaim / defrag)", &|m| {
        format!(
            "{} ({} / {} / {})",
            thousands(m.preemptions),
            thousands(m.preemptions_priority),
            thousands(m.preemptions_reclaim),
            thousands(m.preemptions_defrag)
        )
    });
    row("  jobs preempted / most times one job", &|m| {
        format!(
            "{} / {}",
            thousands(m.jobs_preempted),
            m.max_preemptions_of_a_job
        )
    });
    row("node failures / gang restarts", &|m| {
        format!("{} / {}", m.node_failures, m.restarts)
    });
    row("  under work / healed by a spare", &|m| {
        format!("{} / {}", m.failures_under_work, m.spare_swaps)
    });
    row("  back to running after a failure, mean / p99", &|m| {
        format!(
            "{} / {}",
            human_duration(m.recovery_after_failure_s.mean),
            human_duration(m.recovery_after_failure_s.p99)
        )
    });
    row("  GPU-hours waiting after failures", &|m| {
        format!("{:.1}", m.gpu_hours_waiting_after_failures)
    });
    row("goodput (work ÷ allocated)", &|m| {
        opt_pct(m.goodput_pct, 2)
    });
    row("min tenant entitlement fulfilment", &|m| match (
        &m.min_entitlement_fulfilment_pct,
        &m.min_entitlement_fulfilment_tenant,
    ) {
        (Some(v), Some(t)) => format!("{v:.1} % ({t})"),
        _ => "-".into(),
    });
    row("max time below 90 % of entitlement", &|m| match (
        &m.max_time_below_90_pct,
        &m.max_time_below_90_tenant,
    ) {
        (Some(v), Some(t)) => format!("{v:.1} % ({t})"),
        _ => "-".into(),
    });
    row("jobs completed / rejected / left", &|m| {
        format!(
            "{} / {} / {}",
            thousands(m.jobs_completed),
            m.jobs_rejected,
            m.jobs_unfinished
        )
    });
    row("planning passes (skipped)", &|m| {
        format!("{} ({})", thousands(m.passes), thousands(m.passes_skipped))
    });
    if results.iter().any(|m| m.reserved.is_some()) {
        let of = |m: &Metrics, f: &dyn Fn(&ReservedStats) -> String| {
            m.reserved.as_ref().map_or("-".into(), f)
        };
        let mean = |v: Option<f64>| v.map_or("-".into(), human_duration);
        row("reserved GPUs", &|m| {
            of(m, &|r| {
                let lent = if r.lent { "lent" } else { "not lent" };
                format!("{} ({lent})", thousands(r.gpus))
            })
        });
        row("  used by owners / borrowers while jobs wait", &|m| {
            of(m, &|r| {
                format!(
                    "{} / {}",
                    opt_pct(r.used_by_owners_pct, 1),
                    opt_pct(r.used_by_borrowers_pct, 1)
                )
            })
        });
        row("  borrowers preempted for owners", &|m| {
            of(m, &|r| thousands(r.preemptions))
        });
        row("  owners' jobs in reservations / in the pool", &|m| {
            of(m, &|r| {
                format!(
                    "{} / {}",
                    thousands(r.owner_jobs_in_reservations),
                    thousands(r.owner_jobs_in_pool)
                )
            })
        });
        row("  owners' queueing delay mean, reservations / pool", &|m| {
            of(m, &|r| {
                format!(
                    "{} / {}",
                    mean(r.queueing_delay_mean_in_reservations_s),
                    mean(r.queueing_delay_mean_owners_in_pool_s)
                )
            })
        });
        row("JCT mean, reserving tenants / others", &|m| {
            of(m, &|r| {
                format!(
                    "{} / {}",
                    mean(r.jct_mean_reserving_tenants_s),
                    mean(r.jct_mean_other_tenants_s)
                )
            })
        });
    }
    if let Some(first) = results.first() {
        for (i, t) in first.tenants.iter().enumerate() {
            if t.entitlement_pct <= 0.0 {
                continue;
            }
            row(
                &format!(
                    "tenant {} ({:.1} %): fulfilment, share/ent., <90 %, shortfalls p50/p99",
                    t.tenant, t.entitlement_pct
                ),
                &|m| {
                    let t = &m.tenants[i];
                    format!(
                        "{}, {}, {}, {} × {}/{}",
                        opt_pct(t.entitlement_fulfilment_pct, 1),
                        t.share_vs_entitlement
                            .map_or("-".into(), |r| format!("{r:.2}")),
                        opt_pct(t.time_below_90_pct, 0),
                        thousands(t.shortfalls),
                        human_duration(t.shortfall_s.median),
                        human_duration(t.shortfall_s.p99),
                    )
                },
            );
        }
    }

    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} jobs ({} rows skipped, {} rounded up to whole nodes) on {} {} GPUs \
         ({} nodes × {}{}); load {load:?}, seed {seed}; demand {:.0} GPU-hours over {} of arrivals",
        thousands(summary.jobs),
        thousands(summary.skipped_rows),
        thousands(summary.jobs_rounded_up),
        thousands(summary.fleet_gpus),
        summary.gpu_type,
        thousands(summary.nodes),
        summary.node_gpus,
        match (summary.spare_nodes, summary.spares) {
            (0, _) => String::new(),
            (n, SpareMode::Swap) => format!(", {n} spares swapped in on failures"),
            (n, _) => format!(", {n} spares left idle"),
        },
        summary.demand_gpu_hours,
        human_duration(summary.arrival_span_s as f64),
    );
    if !summary.reservations.is_empty() {
        let list: Vec<String> = (summary.reservations.iter())
            .map(|r| {
                format!(
                    "{} GPUs for {} ({} {})",
                    r.gpus, r.tenant, r.level, r.domain
                )
            })
            .collect();
        let _ = writeln!(out, "capacity reservations: {}", list.join(", "));
    }
    // The metrics down, the policies across: labels left-aligned, values
    // right-aligned, two spaces apart, no borders.
    use comfy_table::{CellAlignment, ContentArrangement, Table};
    let mut t = Table::new();
    t.load_preset(comfy_table::presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(
            std::iter::once(String::new())
                .chain(results.iter().map(|m| policy_label(m.policy).to_string())),
        );
    for (label, values) in &rows {
        t.add_row(std::iter::once(label.clone()).chain(values.iter().cloned()));
    }
    for (i, column) in t.column_iter_mut().enumerate() {
        column.set_padding((if i == 0 { 0 } else { 2 }, 0));
        column.set_cell_alignment(if i == 0 {
            CellAlignment::Left
        } else {
            CellAlignment::Right
        });
    }
    for line in t.lines() {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_units() {
        assert_eq!(human_duration(59.4), "59 s");
        assert_eq!(human_duration(600.0), "10.0 min");
        assert_eq!(human_duration(3.0 * 3600.0), "3.0 h");
        assert_eq!(human_duration(5.0 * 86_400.0), "5.0 d");
        assert_eq!(thousands(82_247), "82,247");
        assert_eq!(thousands(100), "100");
        assert_eq!(thousands(1_000_000), "1,000,000");
    }
}
