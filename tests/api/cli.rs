//! The CLI binary itself.

use std::process::Command;

use crate::helpers::{manifest_dir, temp_dir};

const BIN: &str = env!("CARGO_BIN_EXE_toolrouter");

#[test]
fn check_on_a_broken_manifest_folder_exits_2_and_names_the_file() {
    let dir = temp_dir();
    let folder = manifest_dir(
        dir.path(),
        "broken",
        &[
            (
                "good.json",
                r#"{"name":"good","tools":[{"name":"g","description":"G"}]}"#,
            ),
            ("bad.json", "{\"name\": \"bad\",\n \"tools\": [}\n"),
        ],
    );
    let out = Command::new(BIN).arg("check").arg(&folder).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let bad = folder.join("bad.json").display().to_string();
    assert!(
        stderr.contains(&format!("{bad}:2:")),
        "names the file and line: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn check_on_a_valid_folder_prints_a_summary_and_exits_0() {
    let dir = temp_dir();
    let folder = manifest_dir(
        dir.path(),
        "ok",
        &[(
            "a.json",
            r#"{"name":"a","keywords":["x","y"],"tools":[{"name":"t","description":"T"}]}"#,
        )],
    );
    let out = Command::new(BIN).arg("check").arg(&folder).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("1 domains, 1 tools, 2 keywords"), "{stdout}");
}

#[test]
fn a_wrong_flag_exits_2_and_an_unreachable_daemon_exits_1_with_one_line() {
    let out = Command::new(BIN)
        .args(["route", "--no-such-flag", "hi"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(BIN)
        .args(["groups", "--addr", "http://127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("error: cannot reach the daemon at http://127.0.0.1:1"),
        "{stderr}"
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
}

#[test]
fn configuration_layers_apply_defaults_then_file_then_environment_then_flags() {
    let dir = temp_dir();
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        "settings_ttl = \"3s\"\nfallback = \"core-only\"\nmax_message_bytes = 100\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--print-config", "--config"])
        .arg(&file)
        .args(["--max-message-bytes", "300"])
        .env("TOOLROUTER_FALLBACK", "all-active")
        .env("TOOLROUTER_MAX_MESSAGE_BYTES", "200")
        .env_remove("TOOLROUTER_SETTINGS_TTL")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    for line in [
        "listen = \"127.0.0.1:50051\"", // default
        "settings_ttl = \"3s\"",        // file over default
        "fallback = \"all-active\"",    // environment over file
        "max_message_bytes = 300",      // flag over environment
        "conversation_ttl = \"1day\"",  // default
    ] {
        assert!(
            printed.lines().any(|l| l == line),
            "missing {line:?} in:\n{printed}"
        );
    }
}

#[test]
fn a_bad_config_file_exits_2_naming_the_key() {
    let dir = temp_dir();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "fallbak = \"core-only\"\n").unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--print-config", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("fallbak"));
}

#[tokio::test]
async fn health_exits_0_and_prints_serving_against_a_running_daemon() {
    let dir = temp_dir();
    let app = crate::helpers::spawn_app(crate::helpers::config(dir.path())).await;
    let addr = format!("http://{}", app.addr);
    let out = tokio::process::Command::new(BIN)
        .args(["health", "--addr", &addr])
        .output()
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "SERVING");
    app.stop().await;
}
