//! The C API from C and C++: programs in tests/c/ compiled with the
//! system's `cc` and `c++` against an installed libtutti (scripts/install.sh
//! into a temporary prefix), run under `tutti run` on 1 to 4 ranks, and
//! again built with `-fsanitize=address,undefined`; pkg-config and the CMake
//! package (tests/cmake/) used as a user would.
//!
//! A missing optional tool (pkg-config, cmake, the sanitizer runtime)
//! skips its test with a `SKIPPED` line, unless `TUTTI_C_REQUIRED=1` (which
//! .ci/run sets) or `CI` is set: then it fails and says what to install. A
//! missing `cc` or `c++` always fails.
//!
//! The `tutti` command comes from the same target directory (it is built by
//! `cargo test --workspace`; alone: `cargo build --release -p tutti-cli`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Multi-rank jobs share two cores; one at a time keeps each fast.
static SERIAL: Mutex<()> = Mutex::new(());

/// Every job ends within this (or is killed and fails).
const DEADLINE: Duration = Duration::from_secs(300);

fn here() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The profile directory (target/release) this test was built into.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current test executable");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>")
        .to_path_buf()
}

fn show(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `cmd` to its end or the deadline (then kills it).
fn run(mut cmd: Command, deadline: Duration) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let t = Instant::now();
    // Read the pipes on threads so that a chatty child never blocks.
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let o = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut out, &mut v).ok();
        v
    });
    let e = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut err, &mut v).ok();
        v
    });
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if t.elapsed() > deadline {
            let _ = child.kill();
            let s = child.wait().expect("wait");
            let o = Output {
                status: s,
                stdout: o.join().unwrap_or_default(),
                stderr: e.join().unwrap_or_default(),
            };
            panic!("{cmd:?} passed its deadline of {deadline:?}\n{}", show(&o));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: o.join().unwrap_or_default(),
        stderr: e.join().unwrap_or_default(),
    }
}

/// Whether a missing tool fails the test: `TUTTI_C_REQUIRED=1`, or `CI`
/// set to anything but `false`/`0` (as CI services set it).
fn required() -> bool {
    // The harness's own switches, not the library's configuration.
    #[allow(clippy::disallowed_methods)]
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    var("TUTTI_C_REQUIRED") == "1" || !matches!(var("CI").as_str(), "" | "0" | "false")
}

/// A test cannot run here because `why`: prints `SKIPPED` and returns, or
/// fails where the tool is required ([`required`]).
fn skip(why: &str) {
    assert!(
        !required(),
        "{why}\nTUTTI_C_REQUIRED=1 (or CI) makes this a failure: install it \
         (.ci/run's set-up lists the packages)"
    );
    println!("SKIPPED: {why}");
}

/// libtutti installed under a fresh prefix, once per test binary.
fn prefix() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        // The copies cargo made for this test's build (it links the
        // library's rlib; the .so and .a come from the same rustc run).
        // target/release's own copies are refreshed only when the library
        // is a target of the build, so they may be stale here.
        let deps = target_dir().join("deps");
        assert!(
            deps.join("libtutti_c.so").exists(),
            "{} is missing: this test expects the library built beside it",
            deps.join("libtutti_c.so").display()
        );
        let p = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("tutti-c-prefix-{}", std::process::id()));
        let mut cmd = Command::new("bash");
        cmd.arg(here().join("scripts/install.sh"))
            .arg("--from")
            .arg(&deps)
            .arg(&p);
        let o = run(cmd, Duration::from_secs(60));
        assert!(o.status.success(), "install.sh failed\n{}", show(&o));
        p
    })
}

/// Compiles `src` (in tests/c/) with `compiler` and `flags` into `name`.
fn build(compiler: &str, src: &str, name: &str, flags: &[&str]) -> Result<PathBuf, String> {
    let p = prefix();
    let out = p.join("bin").join(name);
    std::fs::create_dir_all(out.parent().expect("bin")).expect("mkdir bin");
    let mut cmd = Command::new(compiler);
    cmd.args(flags)
        .arg("-Wall")
        .arg("-Wextra")
        .arg("-Werror")
        .arg("-O1")
        .arg("-g")
        .arg(format!("-I{}", p.join("include").display()))
        .arg(here().join("tests/c").join(src))
        .arg("-o")
        .arg(&out)
        .arg(format!("-L{}", p.join("lib").display()))
        .arg("-ltutti")
        .arg(format!("-Wl,-rpath,{}", p.join("lib").display()))
        .args(["-lpthread", "-lm"]);
    let o = run(cmd, Duration::from_secs(120));
    if o.status.success() {
        Ok(out)
    } else {
        Err(show(&o))
    }
}

fn built(compiler: &str, src: &str, name: &str, flags: &[&str]) -> PathBuf {
    build(compiler, src, name, flags).unwrap_or_else(|e| panic!("{compiler} {src}:\n{e}"))
}

/// `tutti run -n n -- prog args`, which must succeed; its output.
fn tutti_run(n: usize, prog: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
    let tutti = target_dir().join("tutti");
    assert!(
        tutti.exists(),
        "{} is missing: `cargo test --workspace` builds it; alone: cargo build --release -p tutti-cli",
        tutti.display()
    );
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut cmd = Command::new(tutti);
    cmd.args(["run", "-n", &n.to_string(), "--"])
        .arg(prog)
        .args(args)
        .env("TUTTI_TIMEOUT", "60")
        .env_remove("TUTTI_RANK")
        .env_remove("RANK")
        .env_remove("SLURM_PROCID")
        .env_remove("OMPI_COMM_WORLD_RANK");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = run(cmd, DEADLINE);
    assert!(o.status.success(), "{prog:?} on {n} ranks\n{}", show(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn every_collective_and_type_on_1_to_4_ranks() {
    let prog = built("cc", "coll.c", "coll", &["-std=c11"]);
    for n in 1..=4 {
        let out = tutti_run(n, &prog, &[], &[]);
        for r in 0..n {
            assert!(out.contains(&format!("OK coll {r}/{n}")), "{out}");
        }
    }
}

#[test]
fn a_config_wire_carries_float_sums_as_bf16_and_the_rest_exactly() {
    let prog = built("cc", "wire.c", "wire", &["-std=c11"]);
    for n in 2..=3 {
        let out = tutti_run(n, &prog, &[], &[]);
        for r in 0..n {
            assert!(out.contains(&format!("OK wire {r}/{n}")), "{out}");
        }
    }
}

#[test]
fn bad_arguments_are_errors_and_abort_frees_a_blocked_thread() {
    let prog = built(
        "cc",
        "errors.c",
        "errors",
        &["-std=c11", "-D_DEFAULT_SOURCE"],
    );
    let out = tutti_run(1, &prog, &[], &[]);
    assert!(out.contains("OK errors"), "{out}");
}

#[test]
fn split_and_shrink_after_a_killed_rank() {
    let prog = built(
        "cc",
        "faults.c",
        "faults",
        &["-std=c11", "-D_DEFAULT_SOURCE"],
    );
    let out = tutti_run(1, &prog, &[], &[]);
    assert!(out.contains("OK faults"), "{out}");
}

#[test]
fn a_cpp_program_builds_and_runs() {
    let prog = built("c++", "cpp.cpp", "cpp", &["-std=c++17"]);
    let out = tutti_run(3, &prog, &[], &[]);
    assert_eq!(out.matches("OK c++").count(), 3, "{out}");
}

#[test]
fn programs_written_for_hccl_and_nccl_run_unchanged() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    for (src, name) in [("hccl_allreduce.c", "hccl"), ("nccl_allreduce.c", "nccl")] {
        let prog = built("cc", src, name, &["-std=c11", "-D_DEFAULT_SOURCE"]);
        let file = dir.join(format!("{name}-rootinfo-{}", std::process::id()));
        let _ = std::fs::remove_file(&file);
        let out = tutti_run(4, &prog, &[file.to_str().expect("utf-8 path")], &[]);
        assert_eq!(out.matches(&format!("OK {name}")).count(), 4, "{out}");
        let _ = std::fs::remove_file(&file);
    }
}

#[test]
fn the_c_tests_pass_under_address_and_undefined_sanitizers() {
    let flags = [
        "-std=c11",
        "-D_DEFAULT_SOURCE",
        "-fsanitize=address,undefined",
    ];
    let flags = [&flags[..], &["-fno-sanitize-recover=all"]].concat();
    let coll = match build("cc", "coll.c", "coll-asan", &flags) {
        Ok(p) => p,
        Err(e) => {
            skip(&format!(
                "the sanitizer runtime is missing (cc -fsanitize=address,undefined fails; \
                 it comes with gcc's libasan and libubsan):\n{e}"
            ));
            return;
        }
    };
    // Rust's runtime keeps some allocations until exit; leaks are not what
    // this checks.
    let env = [("ASAN_OPTIONS", "detect_leaks=0")];
    let out = tutti_run(2, &coll, &[], &env);
    assert_eq!(out.matches("OK coll").count(), 2, "{out}");
    let errors = built("cc", "errors.c", "errors-asan", &flags);
    let out = tutti_run(1, &errors, &[], &env);
    assert!(out.contains("OK errors"), "{out}");
}

#[test]
fn pkg_config_and_the_static_library_link() {
    let p = prefix();
    let pc = p.join("lib/pkgconfig");
    let o = Command::new("pkg-config")
        .args(["--cflags", "--libs", "--static", "tutti"])
        .env("PKG_CONFIG_PATH", &pc)
        .output();
    let flags = match o {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        Ok(o) => panic!("pkg-config tutti failed\n{}", show(&o)),
        Err(e) => {
            skip(&format!(
                "pkg-config is not installed ({e}; apt-get install pkg-config)"
            ));
            return;
        }
    };
    assert!(flags.contains("-ltutti"), "{flags}");
    // Static: the program carries libtutti.a and needs no rpath.
    let out = p.join("bin/hccl-static");
    let mut cmd = Command::new("cc");
    cmd.arg("-std=c11")
        .arg("-D_DEFAULT_SOURCE")
        .arg(here().join("tests/c/hccl_allreduce.c"))
        .arg("-o")
        .arg(&out)
        .arg(format!("-I{}", p.join("include").display()))
        .arg(p.join("lib/libtutti.a"))
        .args(
            flags
                .split_whitespace()
                .filter(|f| f.starts_with("-l") && *f != "-ltutti"),
        );
    let o = run(cmd, Duration::from_secs(120));
    assert!(o.status.success(), "static link\n{}", show(&o));
    let file = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("static-rootinfo-{}", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let out = tutti_run(2, &out, &[file.to_str().expect("utf-8")], &[]);
    assert_eq!(out.matches("OK hccl").count(), 2, "{out}");
    let _ = std::fs::remove_file(&file);
}

/// The CMake package: a project that does `find_package(tutti 0.1
/// REQUIRED)` and links `tutti::tutti` (shared) and `tutti::tutti_static`
/// (tests/cmake/, the example in docs/c.md), configured against the
/// installed prefix, built, and run on 2 ranks.
#[test]
fn a_cmake_project_finds_the_package_and_links_both_libraries() {
    match Command::new("cmake").arg("--version").output() {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!("cmake --version failed\n{}", show(&o)),
        Err(e) => {
            skip(&format!(
                "cmake is not installed ({e}; apt-get install cmake)"
            ));
            return;
        }
    }
    let p = prefix();
    let build = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("tutti-c-cmake-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&build);
    let mut cmd = Command::new("cmake");
    cmd.arg("-S")
        .arg(here().join("tests/cmake"))
        .arg("-B")
        .arg(&build)
        .arg(format!("-DCMAKE_PREFIX_PATH={}", p.display()))
        .arg("-DCMAKE_BUILD_TYPE=Release")
        .arg("-DCMAKE_C_COMPILER=cc");
    let o = run(cmd, Duration::from_secs(120));
    assert!(o.status.success(), "cmake configure\n{}", show(&o));
    let mut cmd = Command::new("cmake");
    cmd.arg("--build").arg(&build);
    let o = run(cmd, Duration::from_secs(240));
    assert!(o.status.success(), "cmake --build\n{}", show(&o));
    for app in ["app", "app_static"] {
        let out = tutti_run(2, &build.join(app), &[], &[]);
        for r in 0..2 {
            assert!(out.contains(&format!("OK cmake {r}/2")), "{app}: {out}");
        }
    }
    // The shared build found libtutti.so through the package (its
    // soname), the static one carries the library.
    let o = Command::new("ldd").arg(build.join("app")).output();
    if let Ok(o) = o {
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            text.contains("libtutti.so.0"),
            "app is not linked to libtutti.so.0:\n{text}"
        );
        let o = Command::new("ldd")
            .arg(build.join("app_static"))
            .output()
            .expect("ldd");
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            !text.contains("libtutti"),
            "app_static links libtutti dynamically:\n{text}"
        );
    }
    let _ = std::fs::remove_dir_all(&build);
}
