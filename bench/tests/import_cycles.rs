//! No module of the workspace imports another that imports it back, directly or through
//! others (the layering rule of the design: crates and modules depend downward only).
//!
//! The check reads every library crate's sources (not `src/bin`, which are crates of
//! their own) and draws an edge from module `a` to module `b` for every path into `b` in
//! `a`'s code: `use crate::b::...`, `crate::b::X` inline, `super::...`, `self::c::...`
//! and a child module's name at the start of a path. Comments, string literals and
//! `#[cfg(test)]` modules are skipped; the crate root (`lib.rs`), whose re-exports are
//! the crate's facade, is not a node. A module's paths into its own submodules are
//! ownership, not imports (a `mod.rs` declares, re-exports and drives its children, and
//! a child may use what its parent defines): those edges are left out. A cycle among
//! the rest fails the test with the modules on it. This is the check `cargo modules dependencies --acyclic` makes, without
//! building that tool in CI.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// A crate's modules: path (`a::b`) to source text.
type Modules = BTreeMap<String, String>;

/// Module path of `file` under `src` (`runtime/mod.rs` -> `runtime`), `None` for the
/// crate root and for binaries.
fn module_path(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts.first().is_some_and(|p| p == "bin") {
        return None;
    }
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs")?;
    match stem {
        "lib" | "main" if parts.is_empty() => return None,
        "mod" => {}
        s => parts.push(s.to_string()),
    }
    Some(parts.join("::"))
}

fn crate_modules(src: &Path) -> Modules {
    let mut out = Modules::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).expect("read src dir") {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                if let Some(m) = module_path(src, &p) {
                    out.insert(m, fs::read_to_string(&p).expect("read source"));
                }
            }
        }
    }
    out
}

/// `text` without comments, string and char literals (replaced by spaces).
fn strip(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if b[i] == b'r' && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#')) {
            // Raw string r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push('r');
                i += 1;
                continue;
            }
            j += 1;
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            while j < b.len() && !b[j..].starts_with(&close) {
                j += 1;
            }
            i = j + close.len();
            out.push(' ');
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push(' ');
        } else if b[i] == b'\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a): skip only the
            // former.
            let end = if b.get(i + 1) == Some(&b'\\') {
                b[i + 2..]
                    .iter()
                    .position(|&c| c == b'\'')
                    .map(|p| i + 2 + p)
            } else if b.get(i + 2) == Some(&b'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(e) => {
                    i = e + 1;
                    out.push(' ');
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            let ch = text[i..].chars().next().expect("char");
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// `code` (stripped) without `#[cfg(test)]` items that are blocks (test modules).
fn without_test_modules(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(p) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..p]);
        let after = &rest[p..];
        // The item: up to its first `{` or `;`.
        let Some(q) = after.find(['{', ';']) else {
            rest = "";
            break;
        };
        if after.as_bytes()[q] == b';' {
            rest = &after[q + 1..];
            continue;
        }
        let mut depth = 0usize;
        let mut end = after.len();
        for (k, c) in after[q..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = q + k + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The paths that start at `at` in `code` (just after a `::`): `a::b::X` gives
/// `["a::b::X"]`, `{a::X, b::{c, d}}` gives `["a::X", "b::c", "b::d"]`.
fn paths_at(code: &str, at: usize) -> Vec<String> {
    let b = code.as_bytes();
    let mut i = at;
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    if b.get(i) == Some(&b'{') {
        let mut depth = 0usize;
        let mut end = b.len();
        for (k, &c) in b[i..].iter().enumerate() {
            match c {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i + k;
                        break;
                    }
                }
                _ => {}
            }
        }
        let inner = &code[i + 1..end];
        let mut items = Vec::new();
        let (mut depth, mut start) = (0usize, 0usize);
        for (k, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    items.push(&inner[start..k]);
                    start = k + 1;
                }
                _ => {}
            }
        }
        items.push(&inner[start..]);
        let mut out = Vec::new();
        for item in items {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            let head: String = item.chars().take_while(|&c| c != ':' && c != '{').collect();
            let head = head.trim();
            match item.find("::") {
                Some(p) => {
                    for sub in paths_at(item, p + 2) {
                        out.push(format!("{head}::{sub}"));
                    }
                }
                None => out.push(head.split_whitespace().next().unwrap_or("").to_string()),
            }
        }
        return out;
    }
    let mut j = i;
    while j < b.len() && (is_ident(b[j]) || (b[j] == b':' && b.get(j + 1) == Some(&b':'))) {
        j += if b[j] == b':' { 2 } else { 1 };
    }
    if b.get(j) == Some(&b'{') && code[i..j].ends_with("::") {
        let head = code[i..j].trim_end_matches("::").to_string();
        return paths_at(code, j)
            .into_iter()
            .map(|s| format!("{head}::{s}"))
            .collect();
    }
    vec![code[i..j].trim_end_matches("::").to_string()]
}

/// The deepest module of `mods` that `path` (segments from the crate root) names.
fn resolve(mods: &Modules, path: &[&str]) -> Option<String> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].join("::"))
        .find(|m| mods.contains_key(m))
}

/// Edges of `module` (its source `text`) into the other modules of `mods`.
fn edges(mods: &Modules, module: &str, text: &str) -> BTreeSet<String> {
    let code = without_test_modules(&strip(text));
    let here: Vec<&str> = module.split("::").collect();
    let children: BTreeSet<&str> = mods
        .keys()
        .filter_map(|m| m.strip_prefix(module)?.strip_prefix("::"))
        .filter(|m| !m.contains("::"))
        .collect();
    let b = code.as_bytes();
    let mut out = BTreeSet::new();
    let mut i = 0;
    while i < b.len() {
        if !is_ident(b[i]) || (i > 0 && (is_ident(b[i - 1]) || b[i - 1] == b':')) {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < b.len() && is_ident(b[j]) {
            j += 1;
        }
        let word = &code[i..j];
        if !code[j..].starts_with("::") {
            i = j;
            continue;
        }
        let base: Option<Vec<&str>> = match word {
            "crate" => Some(Vec::new()),
            "self" => Some(here.clone()),
            "super" => {
                // super::super::x climbs further.
                let mut up = here.clone();
                up.pop();
                let mut k = j + 2;
                while code[k..].starts_with("super::") {
                    up.pop();
                    k += 7;
                }
                for p in paths_at(&code, k) {
                    let full: Vec<&str> = up.iter().copied().chain(p.split("::")).collect();
                    // `super::X` names the parent itself.
                    let target = resolve(mods, &full).or_else(|| Some(up.join("::")));
                    if let Some(t) = target.filter(|t| !t.is_empty() && t != module) {
                        out.insert(t);
                    }
                }
                i = j;
                continue;
            }
            w if children.contains(w) => {
                let mut full = here.clone();
                full.push(w);
                if let Some(t) = resolve(mods, &full) {
                    out.insert(t);
                }
                i = j;
                continue;
            }
            _ => None,
        };
        if let Some(base) = base {
            for p in paths_at(&code, j + 2) {
                let full: Vec<&str> = base.iter().copied().chain(p.split("::")).collect();
                if let Some(t) = resolve(mods, &full).filter(|t| t != module) {
                    out.insert(t);
                }
            }
        }
        i = j;
    }
    out
}

/// The cycles of the graph (one per strongly connected component of two or more
/// modules), each as its modules in order.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Tarjan's algorithm, recursive (module graphs are small).
    struct T<'g> {
        g: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on: BTreeSet<&'g str>,
        out: Vec<Vec<String>>,
    }
    impl<'g> T<'g> {
        fn visit(&mut self, v: &'g str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on.insert(v);
            for w in self.g.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let l = self.low[v].min(self.low[w]);
                    self.low.insert(v, l);
                } else if self.on.contains(w) {
                    let l = self.low[v].min(self.index[w]);
                    self.low.insert(v, l);
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = Vec::new();
                loop {
                    let w = self.stack.pop().expect("on stack");
                    self.on.remove(w);
                    comp.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.reverse();
                    self.out.push(comp);
                }
            }
        }
    }
    let mut t = T {
        g: graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.out
}

fn graph_of(mods: &Modules) -> BTreeMap<String, BTreeSet<String>> {
    mods.iter()
        .map(|(m, text)| {
            let own = format!("{m}::");
            let e = edges(mods, m, text)
                .into_iter()
                .filter(|t| !t.starts_with(&own))
                .collect();
            (m.clone(), e)
        })
        .collect()
}

/// For a cycle found, the edges among its modules, so the message says who imports whom.
fn describe(graph: &BTreeMap<String, BTreeSet<String>>, comp: &[String]) -> String {
    let mut lines = Vec::new();
    for a in comp {
        for b in graph[a].iter().filter(|b| comp.contains(b)) {
            lines.push(format!("    {a} -> {b}"));
        }
    }
    lines.join("\n")
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("bench sits in the workspace")
        .to_path_buf()
}

#[test]
fn no_module_imports_another_that_imports_it_back() {
    let root = workspace_root();
    let mut found = Vec::new();
    let mut crates = 0;
    for e in fs::read_dir(&root).expect("workspace dir") {
        let dir = e.expect("entry").path();
        let src = dir.join("src");
        if !dir.join("Cargo.toml").is_file() || !src.join("lib.rs").is_file() {
            continue;
        }
        crates += 1;
        let mods = crate_modules(&src);
        let graph = graph_of(&mods);
        let name = dir
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        for comp in cycles(&graph) {
            found.push(format!(
                "{name}: {}\n{}",
                comp.join(", "),
                describe(&graph, &comp)
            ));
        }
    }
    assert!(
        crates >= 5,
        "found only {crates} library crates under {root:?}"
    );
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

fn mods(list: &[(&str, &str)]) -> Modules {
    list.iter()
        .map(|(m, t)| (m.to_string(), t.to_string()))
        .collect()
}

#[test]
fn a_planted_circle_through_three_modules_is_found() {
    let m = mods(&[
        ("a", "use crate::b::X;\npub struct A;"),
        ("b", "pub fn f() -> crate::c::C { todo!() }"),
        ("c", "use crate::{a::A, d};"),
        ("d", "pub struct D;"),
    ]);
    let c = cycles(&graph_of(&m));
    assert_eq!(c.len(), 1, "{c:?}");
    let mut names = c[0].clone();
    names.sort();
    assert_eq!(names, ["a", "b", "c"]);
}

#[test]
fn a_parent_owns_its_children_but_siblings_may_not_import_each_other_back() {
    // The parent driving its child, the child using the parent's types: ownership.
    let m = mods(&[
        ("runtime", "mod calls;\nuse calls::Table;\npub struct Ctx;"),
        ("runtime::calls", "use super::Ctx;\npub struct Table;"),
        ("runtime::config", "use super::calls::Table;"),
    ]);
    let g = graph_of(&m);
    assert!(g["runtime"].is_empty(), "{:?}", g["runtime"]);
    assert!(cycles(&g).is_empty());
    // Two children importing each other (through `super::`) are a circle.
    let m = mods(&[
        ("runtime", "mod calls;\nmod config;"),
        ("runtime::calls", "use super::config::Config;"),
        ("runtime::config", "use super::calls::Table;"),
    ]);
    assert_eq!(cycles(&graph_of(&m)).len(), 1);
}

#[test]
fn comments_strings_and_test_modules_are_not_imports() {
    let m = mods(&[
        (
            "a",
            "//! See [`crate::b::B`].\n/// crate::b\nfn f() { let _ = \"crate::b::B\"; \
             let _c = 'x'; }\n#[cfg(test)]\nmod tests { use crate::b::B; fn g() { {} } }\n",
        ),
        ("b", "use crate::a::f;\n/* crate::a */"),
    ]);
    let g = graph_of(&m);
    assert!(g["a"].is_empty(), "{:?}", g["a"]);
    assert_eq!(g["b"].iter().collect::<Vec<_>>(), ["a"]);
    assert!(cycles(&g).is_empty());
}

#[test]
fn nested_braces_and_inline_paths_are_followed() {
    let m = mods(&[
        (
            "x",
            "use crate::{y::{self, Y}, z::Z as W};\nfn f() { crate::w::g(); }",
        ),
        ("y", ""),
        ("z", ""),
        ("w", ""),
    ]);
    let g = graph_of(&m);
    assert_eq!(g["x"].iter().collect::<Vec<_>>(), ["w", "y", "z"]);
}
