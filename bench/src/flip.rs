//! The soak's settings writer (`toolrouter-bench flip-settings`): a second process that sets
//! and clears settings keys in the daemon's database, as a busy settings UI would, while the
//! load generator runs.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use toolrouter::Error;
use toolrouter::db::Db;
use toolrouter::registry::Registry;

/// What one flipping run did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flips {
    /// Writes that succeeded.
    pub writes: u64,
    /// Writes that failed (each is printed to stderr).
    pub failures: u64,
    /// How many distinct settings keys were flipped.
    pub keys: usize,
}

/// Every `every` for `duration`, sets or clears one settings key of the registry in
/// `manifests` (empty: the demo registry): each key in turn, set on even rounds over the
/// keys and cleared on odd ones.
///
/// # Errors
/// Manifests that do not load, a registry without settings keys, or a database that cannot
/// be opened. Failed writes are counted, not errors.
pub async fn flip_settings(
    database: &str,
    manifests: &[PathBuf],
    duration: Duration,
    every: Duration,
) -> toolrouter::Result<Flips> {
    let registry = Registry::load(manifests)?;
    let mut keys: Vec<String> = registry
        .domains()
        .iter()
        .flat_map(|d| d.settings_keys.iter().cloned())
        .collect();
    keys.sort();
    keys.dedup();
    if keys.is_empty() {
        return Err(Error::Config("the registry has no settings keys to flip".into()));
    }
    let db = Db::connect(database).await?;
    let deadline = Instant::now() + duration;
    let (mut writes, mut failures) = (0u64, 0u64);
    let mut tick = tokio::time::interval(every);
    let mut n = 0usize;
    while Instant::now() < deadline {
        tick.tick().await;
        let key = &keys[n % keys.len()];
        let on = (n / keys.len()).is_multiple_of(2);
        n += 1;
        let result = if on {
            db.set_setting(key, "on").await
        } else {
            db.unset_setting(key).await.map(drop)
        };
        match result {
            Ok(()) => writes += 1,
            Err(e) => {
                failures += 1;
                eprintln!("write failed: {e}");
            }
        }
    }
    db.close().await;
    Ok(Flips {
        writes,
        failures,
        keys: keys.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn keys_are_set_and_cleared_in_turn() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        let flips = flip_settings(&url, &[], Duration::from_millis(200), Duration::from_millis(5))
            .await
            .unwrap();
        assert_eq!(flips.failures, 0);
        assert!(flips.writes > 1 && flips.keys > 1, "{flips:?}");
        let db = Db::connect(&url).await.unwrap();
        let rows = db.read_settings().await.unwrap();
        db.close().await;
        assert!(rows.len() <= flips.keys, "{rows:?}");
    }
}
