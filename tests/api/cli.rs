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
