//! `include/tutti.h` is generated from the Rust source by cbindgen: this
//! test regenerates it and fails if the checked-in copy differs. Run with
//! `TUTTI_BLESS=1` to write the new header. Beside it: docs/c.md lists
//! exactly what the compatibility headers define.

use std::path::Path;

#[test]
fn the_checked_in_header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut out);
    let generated = String::from_utf8(out).expect("UTF-8");
    let path = dir.join("include/tutti.h");
    #[allow(clippy::disallowed_methods)] // a test's own switch
    if std::env::var_os("TUTTI_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write include/tutti.h");
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == generated,
        "include/tutti.h is stale: regenerate it with \
         `TUTTI_BLESS=1 cargo test --release -p tutti-c --test header`"
    );
}

/// The names a compatibility header defines for its users: functions
/// (`static inline ... name(`), typedefs, `#define`s and enum members;
/// not the include guard, nor internal helpers (their names end in `_`).
fn compat_names(header: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = Vec::new();
    let mut in_enum = false;
    for line in header.lines().map(str::trim) {
        let name = if let Some(rest) = line.strip_prefix("#define ") {
            ident(rest)
        } else if line.starts_with("typedef enum") {
            in_enum = true;
            continue;
        } else if let Some(rest) = line.strip_prefix('}') {
            in_enum = false;
            ident(rest.trim())
        } else if in_enum {
            ident(line)
        } else if line.starts_with("typedef ") && line.ends_with(';') {
            let body = line.trim_end_matches(';');
            ident(body.rsplit([' ', '*']).next().unwrap_or(""))
        } else if line.starts_with("static inline ") && line.contains('(') {
            let head = &line[..line.find('(').expect("a parenthesis")];
            ident(head.rsplit([' ', '*']).next().unwrap_or(""))
        } else {
            continue;
        };
        if !name.is_empty() && !name.ends_with('_') && !name.starts_with("TUTTI_") {
            names.push(name);
        }
    }
    names
}

/// docs/c.md's list of what `nccl_compat.h` and `hccl_compat.h` cover
/// matches the headers: every name a header defines is in the list, and
/// every NCCL, CUDA, HCCL or ACL name the list says is covered is defined.
#[test]
fn docs_list_exactly_what_the_compat_headers_cover() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let docs = std::fs::read_to_string(dir.join("../../docs/c.md")).expect("docs/c.md");
    let section = docs
        .split("## Compatibility headers")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("docs/c.md has a section `## Compatibility headers`");
    for (file, marker) in [
        ("nccl_compat.h", "**NCCL** (`nccl_compat.h`)"),
        ("hccl_compat.h", "**HCCL** (`hccl_compat.h`)"),
    ] {
        let header = std::fs::read_to_string(dir.join("include").join(file)).expect(file);
        // The list: from the marker to the paragraph of what is not provided.
        let covered = section
            .split(marker)
            .nth(1)
            .and_then(|s| s.split("Not provided").next())
            .unwrap_or_else(|| panic!("docs/c.md lacks the paragraph `{marker}`"));
        let names = compat_names(&header);
        assert!(names.len() > 20, "{file}: only {names:?}");
        let missing: Vec<_> = names
            .iter()
            .filter(|n| !covered.contains(&format!("`{n}`")))
            .collect();
        assert!(
            missing.is_empty(),
            "{file} defines names that docs/c.md's list ({marker}) does not name: {missing:?}"
        );
        // Backquoted names of the originals in the list must exist.
        let claimed = covered
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|w| w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| {
                [
                    "nccl", "NCCL_", "cuda", "Hccl", "HCCL_", "aclrt", "acl", "ACL_",
                ]
                .iter()
                .any(|p| w.starts_with(p))
            });
        for w in claimed {
            assert!(
                names.iter().any(|n| n == w),
                "docs/c.md lists `{w}` as covered by {file}, which does not define it"
            );
        }
    }
}

/// docs/c.md shows the CMake project that `tests/c_api.rs` builds
/// (tests/cmake/CMakeLists.txt): every line of it but the comments.
#[test]
fn docs_show_the_tested_cmake_project() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let docs = std::fs::read_to_string(dir.join("../../docs/c.md")).expect("docs/c.md");
    let project =
        std::fs::read_to_string(dir.join("tests/cmake/CMakeLists.txt")).expect("CMakeLists.txt");
    let shown: Vec<&str> = docs.lines().collect();
    for line in project
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        assert!(
            shown.contains(&line),
            "docs/c.md does not show this line of tests/cmake/CMakeLists.txt: {line}"
        );
    }
}
