//! Job, reservation and cluster ids.
//!
//! A job created with an `Idempotency-Key` gets an id derived from the tenant
//! and the key (UUIDv5), so every replica, and every region that later holds
//! the job's intent, computes the same id for a retried create.

use uuid::Uuid;

/// Namespace for job ids derived from idempotency keys (fixed forever).
const JOB_NAMESPACE: Uuid = Uuid::from_u128(0x6a1c_54e3_0f0b_4a5e_9a55_2c1e_7d3b_9e01);

/// Namespace for capacity reservation ids derived from idempotency keys
/// (fixed forever; not the jobs', so a job and a reservation created with
/// the same key get different ids).
const RESERVATION_NAMESPACE: Uuid = Uuid::from_u128(0x2b7e_0d91_6c3f_4f0a_8d12_5e9b_a4c6_1f37);

/// Namespace for dedicated cluster ids derived from idempotency keys
/// (fixed forever; its own, like the reservations').
const CLUSTER_NAMESPACE: Uuid = Uuid::from_u128(0x9d4f_61a2_3e8b_4c07_b5e1_7a2c_0f96_d358);

/// The id of the job created by `tenant` with idempotency key `key`.
pub fn job_id_for_key(tenant: &str, key: &str) -> Uuid {
    derived(&JOB_NAMESPACE, tenant, key)
}

/// The id of the capacity reservation created by `tenant` with
/// idempotency key `key`.
pub fn reservation_id_for_key(tenant: &str, key: &str) -> Uuid {
    derived(&RESERVATION_NAMESPACE, tenant, key)
}

/// The id of the dedicated cluster created by `tenant` with idempotency
/// key `key`.
pub fn cluster_id_for_key(tenant: &str, key: &str) -> Uuid {
    derived(&CLUSTER_NAMESPACE, tenant, key)
}

fn derived(namespace: &Uuid, tenant: &str, key: &str) -> Uuid {
    let mut name = Vec::with_capacity(tenant.len() + key.len() + 1);
    name.extend_from_slice(tenant.as_bytes());
    name.push(0);
    name.extend_from_slice(key.as_bytes());
    Uuid::new_v5(namespace, &name)
}

/// FNV-1a, 64 bit: stable across builds and platforms (unlike std's
/// hashers), which a routing decision shared by replicas needs.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in *part {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// `names` ranked for `job_id`, best first.
/// (Regions rank a job this way: the global tier to place it, a region
/// to choose the buddy that holds its intent.)
pub fn rendezvous<'a>(job_id: Uuid, names: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut scored: Vec<(u64, &str)> = names
        .into_iter()
        .map(|n| (fnv1a(&[job_id.as_bytes(), n.as_bytes()]), n))
        .collect();
    // Highest score first; the name breaks (improbable) ties.
    scored.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    scored.into_iter().map(|(_, n)| n).collect()
}

/// Checks an `Idempotency-Key`: 1–255 printable ASCII characters.
pub fn valid_idempotency_key(key: &str) -> bool {
    !key.is_empty() && key.len() <= 255 && key.bytes().all(|b| (0x20..0x7f).contains(&b))
}

/// FNV-1a, 32 bits: a short, stable name for a longer one (a tenant's
/// system user, a state dir's database directory), the same on every
/// machine and release. Not for anything an attacker may choose to collide.
pub fn short_hash(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// Checks a tenant name: 1–63 characters of `[a-z0-9-]`, not starting with `-`.
pub fn valid_tenant(tenant: &str) -> bool {
    !tenant.is_empty()
        && tenant.len() <= 63
        && !tenant.starts_with('-')
        && tenant
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_derived_ids_are_stable_and_tenant_scoped() {
        assert_eq!(job_id_for_key("acme", "k1"), job_id_for_key("acme", "k1"));
        assert_ne!(job_id_for_key("acme", "k1"), job_id_for_key("globex", "k1"));
        // The separator keeps ("ab","c") and ("a","bc") apart.
        assert_ne!(job_id_for_key("ab", "c"), job_id_for_key("a", "bc"));
        assert_eq!(
            reservation_id_for_key("acme", "k1"),
            reservation_id_for_key("acme", "k1")
        );
        assert_ne!(
            job_id_for_key("acme", "k1"),
            reservation_id_for_key("acme", "k1")
        );
    }

    #[test]
    fn idempotency_key_rules() {
        assert!(valid_idempotency_key("a"));
        assert!(valid_idempotency_key(&"x".repeat(255)));
        assert!(!valid_idempotency_key(""));
        assert!(!valid_idempotency_key(&"x".repeat(256)));
        assert!(!valid_idempotency_key("tab\there"));
        assert!(!valid_idempotency_key("é"));
    }
}
