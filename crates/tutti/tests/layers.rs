//! The crate's layers, checked from its source: every top-level module of
//! `src/` may use modules of lower layers, and modules of its own layer
//! only where that makes no cycle; never a module of a higher layer.
//!
//! The test reads every `src/**/*.rs`, strips comments and literals, and
//! finds each path that leaves its top-level module: `crate::x` (and
//! `crate::{x, y}`), a `super::` chain that climbs to the crate root, and
//! names the crate root re-exports (`crate::Config` is `config`'s). It
//! fails naming every offending `file:line`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, top first: a module may use those below it, and those
/// beside it (same number) where that makes no cycle.
const LAYERS: &[(&str, u32)] = &[
    // The public face, and the fuzzers' entry points into the parsers.
    ("comm", 7),
    ("fuzzing", 7),
    // Collectives (ordered queue, schedules, tuning's glue) and
    // point-to-point; p2p reports through the engine's `Completion`.
    ("engine", 6),
    ("p2p", 6),
    // Rendezvous and connection set-up.
    ("bootstrap", 5),
    // Cost model and selection: pure numbers in, choices out. It prices
    // transports, so it may read their constants (a mailbox's size).
    ("tune", 4),
    // Moving bytes between ranks.
    ("transport", 3),
    // Leaves usable by all above algo: settings (`TUTTI_ALGO` names algo's
    // algorithms), element types and kernels, hosts, one-shot sizes.
    ("config", 2),
    ("reduce", 2),
    ("topo", 2),
    ("sizes", 2),
    // Pure schedules.
    ("algo", 1),
    ("error", 0),
];

/// Known offenders while they are being fixed: (file under `src/`, module
/// it may still use, why). None today; an entry that no longer matches
/// anything fails the test: remove it.
const ALLOWED: &[(&str, &str, &str)] = &[];

/// A token of Rust source, comments and literals dropped.
#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    Sep,
    Punct(char),
}

/// Where a prefixed string literal opens at `s[i]` (`b"`, `r#"`, `br"`,
/// `c"`, ...): its closing '#' count, whether it is raw, and where its
/// body starts.
fn string_prefix(s: &[char], i: usize) -> Option<(usize, bool, usize)> {
    let mut j = i;
    if matches!(s.get(j), Some('b' | 'c')) {
        j += 1;
    }
    let raw = s.get(j) == Some(&'r');
    if raw {
        j += 1;
    }
    let mut hashes = 0;
    while raw && s.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    (j > i && s.get(j) == Some(&'"')).then_some((hashes, raw, j + 1))
}

/// The tokens of `src` with their line numbers. Strings, chars, numbers
/// and comments are skipped; lifetimes are not identifiers.
fn lex(src: &str) -> Vec<(Tok, usize)> {
    let s: Vec<char> = src.chars().collect();
    let (mut i, mut line, mut out) = (0, 1, Vec::new());
    let ident_start = |c: char| c.is_alphabetic() || c == '_';
    let ident_char = |c: char| c.is_alphanumeric() || c == '_';
    // Skips a string body from `i` (just past its opening quote) to just
    // past the closing quote followed by `hashes` '#'.
    let skip_str = |i: &mut usize, line: &mut usize, hashes: usize, raw: bool| {
        while *i < s.len() {
            let c = s[*i];
            if c == '\n' {
                *line += 1;
            }
            if c == '\\' && !raw {
                if s.get(*i + 1) == Some(&'\n') {
                    *line += 1;
                }
                *i += 2;
                continue;
            }
            *i += 1;
            if c == '"' && s[*i..].iter().take(hashes).filter(|&&h| h == '#').count() == hashes {
                *i += hashes;
                return;
            }
        }
    };
    while i < s.len() {
        let c = s[i];
        let next = s.get(i + 1).copied();
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == Some('/') {
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < s.len() {
                if s[i] == '/' && s.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if s[i] == '*' && s.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(s[i] == '\n');
                    i += 1;
                }
            }
        } else if c == '"' {
            i += 1;
            skip_str(&mut i, &mut line, 0, false);
        } else if let Some((hashes, raw, body)) = string_prefix(&s, i) {
            // b"..", r"..", r#".."#, br#".."#, c"..".
            i = body;
            skip_str(&mut i, &mut line, hashes, raw);
        } else if c == 'b' && next == Some('\'') {
            // A byte: b'x', b'\n'.
            i += 2;
            while i < s.len() && s[i] != '\'' {
                i += if s[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c == '\'' {
            if next == Some('\\') {
                // An escaped char: '\n', '\'', '\u{..}'.
                i += 2;
                while i < s.len() && s[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if s.get(i + 2) == Some(&'\'') {
                i += 3; // a char: 'x', '{'
            } else {
                // A lifetime or label: skip the quote and the name.
                i += 1;
                while i < s.len() && ident_char(s[i]) {
                    i += 1;
                }
            }
        } else if c == 'r' && next == Some('#') && s.get(i + 2).is_some_and(|&c| ident_start(c)) {
            let start = i + 2;
            i = start;
            while i < s.len() && ident_char(s[i]) {
                i += 1;
            }
            out.push((Tok::Ident(s[start..i].iter().collect()), line));
        } else if ident_start(c) {
            let start = i;
            while i < s.len() && ident_char(s[i]) {
                i += 1;
            }
            out.push((Tok::Ident(s[start..i].iter().collect()), line));
        } else if c.is_ascii_digit() {
            while i < s.len()
                && (ident_char(s[i])
                    || s[i] == '.' && s.get(i + 1).is_some_and(|c| c.is_ascii_digit()))
            {
                i += 1;
            }
        } else if c == ':' && next == Some(':') {
            out.push((Tok::Sep, line));
            i += 2;
        } else {
            out.push((Tok::Punct(c), line));
            i += 1;
        }
    }
    out
}

fn ident(t: Option<&(Tok, usize)>) -> Option<&str> {
    match t {
        Some((Tok::Ident(s), _)) => Some(s),
        _ => None,
    }
}

fn is(t: Option<&(Tok, usize)>, want: &Tok) -> bool {
    t.is_some_and(|(t, _)| t == want)
}

/// The first segments a path names from `toks[i]` on: one name, or each
/// element's first name where `toks[i]` opens a `{...}` group.
fn first_segments(toks: &[(Tok, usize)], i: usize) -> Vec<String> {
    if let Some(name) = ident(toks.get(i)) {
        return vec![name.to_string()];
    }
    if !is(toks.get(i), &Tok::Punct('{')) {
        return Vec::new();
    }
    let (mut out, mut depth, mut expect) = (Vec::new(), 0, true);
    for (t, _) in &toks[i..] {
        match t {
            Tok::Punct('{') => {
                depth += 1;
                expect = depth == 1;
            }
            Tok::Punct('}') => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            Tok::Punct(',') if depth == 1 => expect = true,
            Tok::Ident(s) if expect && depth == 1 => {
                out.push(s.clone());
                expect = false;
            }
            _ => {}
        }
    }
    out
}

/// The crate root's modules, and the names it re-exports with the module
/// each comes from (`pub use config::Config;`: Config -> config).
fn root(lib: &str) -> (BTreeSet<String>, BTreeMap<String, String>) {
    let toks = lex(lib);
    let (mut mods, mut names) = (BTreeSet::new(), BTreeMap::new());
    let mut i = 0;
    while i < toks.len() {
        match ident(toks.get(i)) {
            Some("mod") => {
                if let Some(m) = ident(toks.get(i + 1)) {
                    mods.insert(m.to_string());
                }
            }
            Some("use") => {
                let from = ident(toks.get(i + 1)).unwrap_or_default().to_string();
                let mut j = i + 2;
                while j < toks.len() && !is(toks.get(j), &Tok::Punct(';')) {
                    // A leaf's name (its alias, if any) ends it.
                    if let Some(name) = ident(toks.get(j)) {
                        let end = [Tok::Punct(','), Tok::Punct('}'), Tok::Punct(';')];
                        if name != "self" && end.iter().any(|e| is(toks.get(j + 1), e)) {
                            names.insert(name.to_string(), from.clone());
                        }
                    }
                    j += 1;
                }
                i = j;
            }
            _ => {}
        }
        i += 1;
    }
    (mods, names)
}

/// One use of another top-level module.
#[derive(Debug)]
struct Use {
    from: String,
    to: String,
    file: String,
    line: usize,
}

/// Every use in `src` (the file at `rel` under `src/`) of a top-level
/// module other than its own.
fn uses(
    rel: &str,
    src: &str,
    mods: &BTreeSet<String>,
    names: &BTreeMap<String, String>,
) -> Vec<Use> {
    // The file's module path: engine/plan.rs is [engine, plan],
    // engine/mod.rs and error.rs are [engine] and [error].
    let mut path: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if path.last().is_some_and(|l| l == "mod") {
        path.pop();
    }
    let top = path[0].clone();
    let toks = lex(src);
    let mut out = Vec::new();
    let mut add = |to: &str, line: usize| {
        let to = if mods.contains(to) {
            to.to_string()
        } else if let Some(m) = names.get(to) {
            m.clone()
        } else {
            panic!("{rel}:{line}: `crate::{to}` is neither a module nor a re-export of lib.rs");
        };
        if to != top {
            out.push(Use {
                from: top.clone(),
                to,
                file: rel.to_string(),
                line,
            });
        }
    };
    // Inline modules (`mod tests { .. }`) open at a brace depth.
    let (mut depth, mut inline): (usize, Vec<usize>) = (0, Vec::new());
    let mut i = 0;
    while i < toks.len() {
        let (t, line) = &toks[i];
        let starts_path = i == 0 || !is(toks.get(i - 1), &Tok::Sep);
        match t {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth -= 1;
                while inline.last().is_some_and(|&d| d > depth) {
                    inline.pop();
                }
            }
            Tok::Ident(k)
                if k == "mod"
                    && ident(toks.get(i + 1)).is_some()
                    && is(toks.get(i + 2), &Tok::Punct('{')) =>
            {
                inline.push(depth + 1);
            }
            Tok::Ident(k) if k == "crate" && starts_path && is(toks.get(i + 1), &Tok::Sep) => {
                for name in first_segments(&toks, i + 2) {
                    add(&name, *line);
                }
            }
            Tok::Ident(k) if k == "super" && starts_path && is(toks.get(i + 1), &Tok::Sep) => {
                let mut ups = 0;
                let mut j = i;
                while ident(toks.get(j)) == Some("super") && is(toks.get(j + 1), &Tok::Sep) {
                    ups += 1;
                    j += 2;
                }
                if ups == path.len() + inline.len() {
                    for name in first_segments(&toks, j) {
                        add(&name, *line);
                    }
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// A cycle among the modules of `edges`, if there is one.
fn cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(k) = stack.iter().position(|s| s == m) {
            let mut c = stack[k..].to_vec();
            c.push(m.to_string());
            return Some(c);
        }
        if done.contains(m) {
            return None;
        }
        stack.push(m.to_string());
        for n in edges.get(m).into_iter().flatten() {
            if let Some(c) = visit(n, edges, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|m| visit(m, edges, &mut Vec::new(), &mut done))
}

#[test]
fn no_module_uses_a_layer_above_it_and_none_make_a_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("reading lib.rs");
    let (mods, names) = root(&lib);
    let level: BTreeMap<&str, u32> = LAYERS.iter().copied().collect();
    let mut problems = Vec::new();
    for m in &mods {
        if !level.contains_key(m.as_str()) {
            problems.push(format!(
                "module `{m}` is not in the LAYERS table of this test"
            ));
        }
    }
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut all = Vec::new();
    let mut text = BTreeMap::new();
    for f in &files {
        let rel = f
            .strip_prefix(&src)
            .expect("under src")
            .to_string_lossy()
            .replace('\\', "/");
        if rel == "lib.rs" {
            continue;
        }
        let body = std::fs::read_to_string(f).expect("reading a source file");
        all.extend(uses(&rel, &body, &mods, &names));
        text.insert(rel, body);
    }
    assert!(!all.is_empty(), "no uses found: is the lexer broken?");
    let mut used_allowances = BTreeSet::new();
    let mut sideways: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for u in &all {
        let (Some(&from), Some(&to)) = (level.get(u.from.as_str()), level.get(u.to.as_str()))
        else {
            continue; // reported above
        };
        let allowed = ALLOWED
            .iter()
            .position(|&(f, m, _)| f == u.file && m == u.to);
        if let Some(k) = allowed {
            used_allowances.insert(k);
            continue;
        }
        if from == to {
            sideways
                .entry(u.from.clone())
                .or_default()
                .insert(u.to.clone());
        } else if from < to {
            let src_line = text[&u.file].lines().nth(u.line - 1).unwrap_or("").trim();
            problems.push(format!(
                "src/{}:{}: {} (layer {from}) uses {} (layer {to}), a layer above it: {src_line}",
                u.file, u.line, u.from, u.to
            ));
        }
    }
    if let Some(c) = cycle(&sideways) {
        let at: Vec<String> = c
            .windows(2)
            .map(|w| {
                let u = all
                    .iter()
                    .find(|u| u.from == w[0] && u.to == w[1])
                    .expect("an edge");
                format!("{} -> {} (src/{}:{})", w[0], w[1], u.file, u.line)
            })
            .collect();
        problems.push(format!(
            "modules of one layer use each other in a cycle: {}",
            at.join(", ")
        ));
    }
    for (k, (f, m, why)) in ALLOWED.iter().enumerate() {
        if !used_allowances.contains(&k) {
            problems.push(format!(
                "the allow-list entry (src/{f} -> {m}: {why}) matches nothing now: remove it"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "layer violations:\n{}",
        problems.join("\n")
    );
}

/// The lexer sees paths in code, not in comments, strings or chars.
#[test]
fn the_lexer_skips_comments_literals_and_lifetimes() {
    let src = r##"
        // crate::a
        /* crate::b /* nested */ crate::c */
        fn f<'x>(s: &'x str) -> char { let _ = "crate::d \" {"; let _ = r#"crate::e"#; '{' }
        use crate::{g, h::{I, J}, k};
        mod tests { use super::super::super::m; use super::super::p; }
        pub(super) fn n() { super::o(); }
    "##;
    let mods: BTreeSet<String> = ["g", "h", "k", "m", "o", "p"].map(String::from).into();
    let found: Vec<(String, usize)> = uses("top/x.rs", src, &mods, &BTreeMap::new())
        .into_iter()
        .map(|u| (u.to, u.line))
        .collect();
    let want = [("g", 5), ("h", 5), ("k", 5), ("m", 6)].map(|(m, l)| (m.to_string(), l));
    assert_eq!(found, want);
}
