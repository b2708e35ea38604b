//! Writing a workload out, to serve it for real: manifests a daemon loads, the messages the
//! load generator sends, the labelled queries `toolrouter eval` reads, and a database whose
//! settings activate every domain (`toolrouter-bench export`).

use std::io::Write as _;
use std::path::Path;

use serde_json::{Value, json};
use toolrouter::db::Db;
use toolrouter::registry::Registry;
use toolrouter::registry::manifest::valid_domain_name;

use crate::workload::Workload;

/// Writes `workload` into `out`, a new or empty folder: `manifests/`, `messages.jsonl`,
/// `toolrouter.db` (or the settings into `database` instead) and, for the eval sets,
/// `queries.jsonl`.
///
/// # Errors
/// A folder that is not empty (an earlier export's manifests and settings would mix with
/// this one's), a file that cannot be written, or a database that cannot be opened or
/// written.
pub async fn export(workload: &Workload, out: &Path, database: Option<&str>) -> toolrouter::Result<()> {
    let io = |source| toolrouter::Error::Io {
        context: format!("cannot write to {}", out.display()),
        source,
    };
    if std::fs::read_dir(out).is_ok_and(|mut entries| entries.next().is_some()) {
        return Err(toolrouter::Error::Config(format!(
            "{} is not empty: export into a new or empty folder (the files of an earlier \
             export would mix with this one's)",
            out.display()
        )));
    }
    let manifests = out.join("manifests");
    std::fs::create_dir_all(&manifests).map_err(io)?;
    write_manifests(&workload.registry, &manifests).map_err(io)?;
    write_messages(&workload.messages, &out.join("messages.jsonl")).map_err(io)?;
    if !workload.labelled.is_empty() {
        write_labelled(&workload.labelled, &out.join("queries.jsonl")).map_err(io)?;
    }
    // The settings that activate every domain, in the database a daemon can be pointed at.
    let file = format!("sqlite://{}", out.join("toolrouter.db").display());
    let db = Db::connect(database.unwrap_or(&file)).await?;
    for (key, value) in workload.settings.rows() {
        db.set_setting(key, value).await?;
    }
    db.close().await;
    Ok(())
}

/// Writes labelled messages as `toolrouter eval` reads them (JSONL).
///
/// # Errors
/// The file cannot be written.
pub fn write_labelled(labelled: &[toolrouter::eval::Labelled], path: &Path) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for l in labelled {
        serde_json::to_writer(&mut out, l)?;
        out.write_all(b"\n")?;
    }
    out.flush()
}

/// Writes one native JSON manifest per domain into `dir` (created if missing), as
/// `<name>.json`. Loading the folder gives a registry of the same version when every name,
/// description and keyword passes manifest validation (true of the `demo`, `seal` and
/// `scale` workloads, not of `stb`).
///
/// # Errors
/// A domain name that is not a valid file name, a schema that is not JSON, or a write that
/// fails.
pub fn write_manifests(registry: &Registry, dir: &Path) -> std::io::Result<()> {
    use std::io::{Error, ErrorKind};
    std::fs::create_dir_all(dir)?;
    for d in registry.domains() {
        if !valid_domain_name(&d.name) {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("domain name {:?} is not a valid manifest name", d.name),
            ));
        }
        let tools = d
            .tools
            .iter()
            .map(|t| {
                let schema: Value = serde_json::from_str(&t.input_schema_json)
                    .map_err(|e| Error::new(ErrorKind::InvalidData, e))?;
                Ok(json!({
                    "name": t.name,
                    "description": t.description,
                    "tier": t.tier.as_str(),
                    "input_schema": schema,
                }))
            })
            .collect::<std::io::Result<Vec<Value>>>()?;
        let manifest = json!({
            "name": d.name,
            "display_name": d.display_name,
            "description": d.description,
            "settings_keys": d.settings_keys,
            "keywords": d.keywords,
            "core": d.core,
            "fallback": d.fallback,
            "tools": tools,
        });
        let mut text =
            serde_json::to_vec_pretty(&manifest).map_err(|e| Error::new(ErrorKind::InvalidData, e))?;
        text.push(b'\n');
        std::fs::write(dir.join(format!("{}.json", d.name)), text)?;
    }
    Ok(())
}

/// Writes the messages to `path`, one JSON string per line.
///
/// # Errors
/// When the file cannot be written.
pub fn write_messages(messages: &[String], path: &Path) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for m in messages {
        serde_json::to_writer(&mut out, m)?;
        out.write_all(b"\n")?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_registry_round_trips_through_written_manifests() {
        let w = crate::workload::demo();
        let dir = tempfile::tempdir().unwrap();
        write_manifests(&w.registry, dir.path()).unwrap();
        let loaded = Registry::load_dirs(&[dir.path().to_path_buf()]).unwrap();
        assert_eq!(loaded.version(), w.registry.version());
    }

    #[tokio::test]
    async fn an_export_goes_into_a_new_or_empty_folder_only() {
        let w = crate::workload::demo();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        export(&w, &out, None).await.unwrap();
        assert!(out.join("manifests").join("sonarr.json").exists());
        let e = export(&w, &out, None).await.unwrap_err().to_string();
        assert!(e.contains("is not empty"), "{e}");
        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        export(&w, &empty, None).await.unwrap();
    }

    #[test]
    fn messages_are_written_one_json_string_per_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.jsonl");
        let messages = vec!["a \"quoted\"\nline".to_string(), "Hörbuch".to_string()];
        write_messages(&messages, &path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let back: Vec<String> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(back, messages);
    }
}
