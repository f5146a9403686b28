//! The import-circle check: no module of a crate, at any depth, imports a module that imports it
//! back, directly or through others.
//!
//! The nodes are the file modules (`src/a.rs` and `src/a/mod.rs` are `a`, `src/a/b.rs` is
//! `a::b`, `lib.rs`/`main.rs` the crate root `crate`). An edge `m -> t` is a path in `m`'s code
//! (a `use` or an inline `crate::`/`super::`/`self::`/child-module path) that names an item
//! defined in `t`. A name is followed through the `use` declarations of the module it is named in
//! (so `super::Gather`, which the parent re-exports from `action`, is an edge to `action`, not to
//! the parent). A `pub use` is the module's face, not a use: it is an edge only when the module's
//! own code names what it re-exports. Declarations (`mod x;`), comment lines, items gated by
//! `#[cfg(doc)]`, and everything from the first `#[cfg(test)]` on do not count. The check reads
//! the sources, so it needs no build.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// `module -> modules it imports from`.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// The crates (source folders under the workspace root) the gate checks.
pub const CRATES: [&str; 8] = [
    "eplb-core/src",
    "eplb-policies/src",
    "eplb-map/src",
    "eplb-runtime/src",
    "eplb-sim/src",
    "eplb-cli/src",
    "python/src",
    "xtask/src",
];

/// One `use` declaration's binding: `name` stands for the absolute path `target`.
#[derive(Debug, Clone)]
struct Binding {
    name: String,
    target: Vec<String>,
    public: bool,
}

/// One file module, read.
#[derive(Debug, Default)]
struct Module {
    /// Its `use` bindings (crate-internal and external alike; the external ones never resolve).
    uses: Vec<Binding>,
    /// Its code without the `use` declarations.
    body: String,
}

/// Every circle-free check at once: `Err` names a circle of each crate that has one.
pub fn check(root: &Path) -> Result<(), String> {
    let mut found = Vec::new();
    for krate in CRATES {
        let src = root.join(krate);
        if !src.is_dir() {
            continue;
        }
        let graph = module_graph(&src)?;
        if let Some(circle) = find_circle(&graph) {
            found.push(format!("{krate}: {}", circle.join(" -> ")));
        }
    }
    if found.is_empty() {
        Ok(())
    } else {
        Err(format!("import circles: {}", found.join("; ")))
    }
}

/// The module path of a source file under `src` (`None` for a file that is not `.rs`).
fn module_path(src: &Path, file: &Path) -> Option<Vec<String>> {
    if file.extension().is_none_or(|x| x != "rs") {
        return None;
    }
    let rel = file.strip_prefix(src).ok()?;
    let mut segs: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = segs.pop()?;
    let stem = last.trim_end_matches(".rs");
    let at_root = segs.is_empty();
    if !(stem == "mod" || (at_root && (stem == "lib" || stem == "main"))) {
        segs.push(stem.to_owned());
    }
    Some(segs)
}

fn name_of(path: &[String]) -> String {
    if path.is_empty() {
        "crate".to_owned()
    } else {
        path.join("::")
    }
}

/// The code of a file that counts: before the tests, without comment lines and items gated by
/// `#[cfg(doc)]`.
fn code_of(text: &str) -> String {
    let before_tests = text.split("#[cfg(test)]").next().unwrap_or("");
    let mut out = String::new();
    let mut skip_doc_item = false;
    for line in before_tests.lines() {
        let t = line.trim_start();
        if t.starts_with("//") {
            continue;
        }
        if t.starts_with("#[cfg(doc)]") {
            skip_doc_item = true;
            continue;
        }
        if skip_doc_item {
            // The gated item: up to the end of its statement.
            if t.ends_with(';') || t.ends_with('}') {
                skip_doc_item = false;
            }
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Splits `code` into its `use` declarations (each `(public, tree)`) and the rest.
fn split_uses(code: &str) -> (Vec<(bool, String)>, String) {
    let mut uses = Vec::new();
    let mut body = String::new();
    let mut rest = code;
    loop {
        let Some(i) = find_use(rest) else {
            body.push_str(rest);
            break;
        };
        body.push_str(&rest[..i.start]);
        let after = &rest[i.tree..];
        let end = after.find(';').unwrap_or(after.len());
        uses.push((i.public, after[..end].trim().to_owned()));
        rest = after.get(end + 1..).unwrap_or("");
    }
    (uses, body)
}

struct UseAt {
    start: usize,
    tree: usize,
    public: bool,
}

/// The next `use` declaration in `code`: where it starts and where its tree starts.
fn find_use(code: &str) -> Option<UseAt> {
    let mut from = 0;
    while let Some(k) = code[from..].find("use ") {
        let at = from + k;
        from = at + 4;
        // A statement start: only whitespace, `pub`, `pub(...)` before it on its line.
        let line_start = code[..at].rfind('\n').map_or(0, |n| n + 1);
        let head = code[line_start..at].trim();
        let public = head.starts_with("pub");
        let ok =
            head.is_empty() || head == "pub" || (head.starts_with("pub(") && head.ends_with(')'));
        if ok {
            return Some(UseAt {
                start: line_start,
                tree: at + 4,
                public,
            });
        }
    }
    None
}

/// The bindings of a use tree (`a::b::{c, d::e as f, self}`), with `prefix` before it.
fn bindings(tree: &str, prefix: &[String], public: bool, out: &mut Vec<Binding>) {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let mut path = prefix.to_vec();
        path.extend(segments(&tree[..open]));
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        for item in split_top(inner) {
            bindings(item, &path, public, out);
        }
        return;
    }
    let (path_part, alias) = match tree.split_once(" as ") {
        Some((p, a)) => (p, Some(a.trim().to_owned())),
        None => (tree, None),
    };
    let mut path = prefix.to_vec();
    path.extend(segments(path_part));
    if path.last().is_some_and(|s| s == "self") {
        path.pop();
    }
    if path.last().is_some_and(|s| s == "*") {
        return;
    }
    let Some(last) = path.last().cloned() else {
        return;
    };
    out.push(Binding {
        name: alias.unwrap_or(last),
        target: path,
        public,
    });
}

fn segments(path: &str) -> Vec<String> {
    path.split("::")
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

/// `a, b::{c, d}, e` split at the commas outside braces.
fn split_top(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0usize, 0);
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out.into_iter().filter(|x| !x.trim().is_empty()).collect()
}

/// The paths `a::b::c` in `body` (identifiers joined by `::`, at least two segments).
fn body_paths(body: &str) -> Vec<Vec<String>> {
    let b = body.as_bytes();
    let is_id = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if !is_id(b[i]) || (i > 0 && is_id(b[i - 1])) {
            i += 1;
            continue;
        }
        let mut path = Vec::new();
        let mut j = i;
        loop {
            let start = j;
            while j < b.len() && is_id(b[j]) {
                j += 1;
            }
            path.push(body[start..j].to_owned());
            if b.get(j..j + 2) == Some(b"::".as_slice()) && b.get(j + 2).is_some_and(|&c| is_id(c))
            {
                j += 2;
            } else {
                break;
            }
        }
        if path.len() > 1 {
            out.push(path);
        }
        i = j.max(i + 1);
    }
    out
}

/// The identifiers of `body`.
fn idents(body: &str) -> BTreeSet<&str> {
    body.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|s| !s.is_empty())
        .collect()
}

/// The crate-internal absolute path of `path` as written in module `at`, or `None` when it
/// names something outside the crate.
fn absolute(
    path: &[String],
    at: &[String],
    modules: &BTreeMap<Vec<String>, Module>,
) -> Option<Vec<String>> {
    let first = path.first()?;
    let (mut base, rest) = match first.as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "self" => (at.to_vec(), &path[1..]),
        "super" => {
            let mut base = at.to_vec();
            let mut rest = path;
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
            (base, rest)
        }
        _ => {
            let mut child = at.to_vec();
            child.push(first.clone());
            if modules.contains_key(&child) {
                (child, &path[1..])
            } else {
                return None;
            }
        }
    };
    base.extend(rest.iter().cloned());
    Some(base)
}

/// The module that defines what the absolute `path` names, following `use` bindings (at most
/// `depth` of them).
fn defining(
    path: &[String],
    modules: &BTreeMap<Vec<String>, Module>,
    depth: usize,
) -> Option<Vec<String>> {
    let mut m = path.len();
    while !modules.contains_key(&path[..m]) {
        m = m.checked_sub(1)?;
    }
    let module = &path[..m];
    let (Some(name), Some(def)) = (path.get(m), modules.get(module)) else {
        return Some(module.to_vec());
    };
    if depth > 0
        && let Some(b) = def.uses.iter().find(|b| &b.name == name)
    {
        // A name imported from outside the crate is no edge.
        let mut next = absolute(&b.target, module, modules)?;
        next.extend(path[m + 1..].iter().cloned());
        return defining(&next, modules, depth - 1);
    }
    Some(module.to_vec())
}

/// Edges `module -> module` of every file module under `src`, at any depth.
pub fn module_graph(src: &Path) -> Result<Graph, String> {
    let mut modules: BTreeMap<Vec<String>, Module> = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for entry in entries {
            let path = entry.map_err(|e| e.to_string())?.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let Some(at) = module_path(src, &path) else {
                continue;
            };
            let text =
                std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let (decls, body) = split_uses(&code_of(&text));
            let mut uses = Vec::new();
            for (public, tree) in decls {
                bindings(&tree, &[], public, &mut uses);
            }
            modules.insert(at, Module { uses, body });
        }
    }
    let mut graph = Graph::new();
    for (at, module) in &modules {
        let here = name_of(at);
        let named = idents(&module.body);
        let mut targets: Vec<Vec<String>> = Vec::new();
        for b in &module.uses {
            if b.public && !named.contains(b.name.as_str()) {
                continue;
            }
            targets.extend(absolute(&b.target, at, &modules));
        }
        for path in body_paths(&module.body) {
            // A path through a name this module imports starts at the import's target.
            let expanded = match module.uses.iter().find(|b| Some(&b.name) == path.first()) {
                Some(b) => {
                    let mut p = b.target.clone();
                    p.extend(path[1..].iter().cloned());
                    p
                }
                None => path,
            };
            targets.extend(absolute(&expanded, at, &modules));
        }
        let deps = graph.entry(here.clone()).or_default();
        for t in targets {
            if let Some(def) = defining(&t, &modules, 8) {
                let name = name_of(&def);
                if name != here {
                    deps.insert(name);
                }
            }
        }
    }
    Ok(graph)
}

/// A circle of `graph`, if there is one (depth-first, in name order).
pub fn find_circle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == node) {
            let mut circle = path[i..].to_vec();
            circle.push(node.to_owned());
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(c) = visit(node, graph, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_circle_is_found_and_a_tree_has_none() {
        let g = |edges: &[(&str, &str)]| {
            let mut m = Graph::new();
            for (a, b) in edges {
                m.entry((*a).into()).or_default().insert((*b).into());
            }
            m
        };
        assert_eq!(find_circle(&g(&[("a", "b"), ("b", "c"), ("a", "c")])), None);
        assert_eq!(
            find_circle(&g(&[("a", "b"), ("b", "c"), ("c", "a")])),
            Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
        );
    }

    /// A crate under a fresh temporary folder: `(path, text)` files under `src`.
    fn scratch(name: &str, files: &[(&str, &str)]) -> std::path::PathBuf {
        let dir = std::env::temp_dir()
            .join(format!("xtask-circles-{}-{name}", std::process::id()))
            .join("src");
        let _ = std::fs::remove_dir_all(&dir);
        for (path, text) in files {
            let p = dir.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        dir
    }

    #[test]
    fn a_nested_circle_is_found() {
        let src = scratch(
            "nested",
            &[
                ("lib.rs", "mod rank;\n"),
                (
                    "rank/mod.rs",
                    "mod agree;\nmod members;\npub use agree::Agree;\npub struct Machine;\n",
                ),
                (
                    "rank/agree.rs",
                    "use super::members::Step;\npub struct Agree(Step);\n",
                ),
                (
                    "rank/members.rs",
                    "pub struct Step;\nfn f() { let _ = super::agree::Agree(Step); }\n",
                ),
            ],
        );
        let g = module_graph(&src).unwrap();
        assert!(g["rank::agree"].contains("rank::members"), "{g:?}");
        assert!(g["rank::members"].contains("rank::agree"), "{g:?}");
        let circle = find_circle(&g).unwrap();
        assert!(circle.contains(&"rank::agree".to_owned()), "{circle:?}");
        assert!(circle.contains(&"rank::members".to_owned()), "{circle:?}");
    }

    #[test]
    fn names_are_followed_through_re_exports_to_their_module() {
        let src = scratch(
            "reexport",
            &[
                ("lib.rs", "pub mod rank;\n"),
                (
                    "rank/mod.rs",
                    "mod action;\nmod local;\npub use action::Gather;\npub use local::Driver;\n\
                     pub struct Machine(Gather);\n",
                ),
                ("rank/action.rs", "pub enum Gather { Heat }\n"),
                (
                    "rank/local.rs",
                    "use super::{Gather, Machine};\npub struct Driver(Machine, Gather);\n",
                ),
            ],
        );
        let g = module_graph(&src).unwrap();
        // `super::Gather` is action's; `super::Machine` is the parent's own.
        assert!(g["rank::local"].contains("rank::action"), "{g:?}");
        assert!(g["rank::local"].contains("rank"), "{g:?}");
        // The parent names Gather in its code (an edge), and only re-exports Driver (none).
        assert!(g["rank"].contains("rank::action"), "{g:?}");
        assert!(!g["rank"].contains("rank::local"), "{g:?}");
        assert_eq!(find_circle(&g), None);
        // A parent that uses the child's item in its own code closes the circle.
        let src = scratch(
            "parent",
            &[
                ("lib.rs", "pub mod rank;\n"),
                (
                    "rank/mod.rs",
                    "mod local;\nuse local::Driver;\npub struct Machine;\nfn f(_: Driver) {}\n",
                ),
                ("rank/local.rs", "pub struct Driver(super::Machine);\n"),
            ],
        );
        let g = module_graph(&src).unwrap();
        assert_eq!(
            find_circle(&g),
            Some(vec!["rank".into(), "rank::local".into(), "rank".into()])
        );
    }

    #[test]
    fn no_crate_of_the_workspace_has_a_circle() {
        check(&crate::root()).unwrap();
    }

    #[test]
    fn the_runtime_graph_is_read_at_every_depth_and_has_no_circle() {
        let g = module_graph(&crate::root().join("eplb-runtime").join("src")).unwrap();
        assert!(g["startup"].contains("controller"), "{g:?}");
        assert!(g["controller"].contains("rank"), "{g:?}");
        assert!(!g["rank"].contains("controller"), "{g:?}");
        // The rank machine's rooms: nested modules, the word format below them.
        assert!(g["rank::members"].contains("rank::wire"), "{g:?}");
        assert!(g["rank::agree"].contains("rank::wire"), "{g:?}");
        assert!(!g["rank::agree"].contains("rank::members"), "{g:?}");
        assert!(!g["rank::members"].contains("rank::agree"), "{g:?}");
        assert_eq!(find_circle(&g), None);
    }
}
